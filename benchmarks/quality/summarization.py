"""News articles -> headlines (docs/RESULTS.md): lead-k, and each model family tuned on the recipe's validation
split (each of LEVERS added to the best settings so far, kept if it raises ROUGE-1; then each of DECODING), a row
trained with the choice and scored on the test split. Script runs are stored under RUNS/headlines and read back
while their command is the same; a row writes RECORDS/ROW.json; the tables print the records that exist.

    OMP_NUM_THREADS=1 python -m benchmarks.quality.summarization --rows lead fastformer-512 bert2bert-512

With --chosen, the rows train with that choice instead of their family's tuning (rows at another source length, on
a choice made before).
"""

import json
import random
import statistics
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, BertModel

from benchmarks import harness
from benchmarks.harness import DOCS, REPO, SCRIPTS, arguments, flags, machine, minilm, read_json, write_json
from fastformer import FastformerCopyConfig, FastformerCopyForConditionalGeneration, FastformerForConditionalGeneration
from fastformer.conversion import copy_bert_cross_attention
from scripts.bert2bert import bert2bert_model
from scripts.frozen_encoder import token_state_spread
from scripts.headline_rules import (
    clean_source,
    headline_quality,
    headline_style,
    headline_words,
    keyword_headline,
    lead_words,
)
from scripts.rouge_metric import rouge

# every family starts from the recipe with the cross-attention as transformers initializes a new one, and no stage
LEVER_BASE = {"cross_attention_init": "random", "copy_mechanism": False, "pretrain": None}
# added in turn: script flags, or the start's cross_attention_init ("random" or "self_attention") and copy_mechanism
# (the pointer-generator head, on BERT2BERT too: CopyEncoderDecoderModel), pretrain (a first stage on pseudo-summaries
# of unlabeled text: make_pseudo_summaries.py's flags), continue (a second stage from the headline run: its flags)
LEVERS = {
    "cross-attention init": {"cross_attention_init": "self_attention"},
    "pseudo-summary pretraining": {"pretrain": {"mode": "lead"}},
    "copyable pseudo-summaries": {"pretrain": {"mode": "lead", "keep_gap": True, "summary_words": 12}},
    "copyable salient spans": {"pretrain": {"mode": "salient", "keep_gap": True, "summary_words": 12}},
    "copy mechanism": {"copy_mechanism": True},
    "label smoothing": {"label_smoothing_factor": 0.1},
    "unfreezing": {"continue": {"learning_rate": 3e-5, "num_train_epochs": 1, "train_encoder_layers": 2}},
}
SPLITS = ("train", "validation", "test")
SPREAD_KEPT = 0.5  # unfreezing is kept only while the encoder's token-state spread stays above this share
# the pretraining stage: one epoch at half the source length (articles have ~225 words, lead sentences ~20)
PRETRAIN = {"num_train_epochs": 1, "max_source_length": 256, "max_target_length": 48}
GREEDY = {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0}  # the levers' decoding
BEAMS = {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 3}
# length_window: between the 5th and 95th percentile of the training headlines' lengths in tokens; no token twice
# (no_repeat_ngram_size 1) or fewer (repetition_penalty), longer (length_penalty)
WINDOW = {**BEAMS, "length_window": True}
DECODING = [GREEDY, {**GREEDY, "no_repeat_ngram_size": 3}, BEAMS, WINDOW, {**WINDOW, "no_repeat_ngram_size": 1}]
DECODING += [{**WINDOW, "repetition_penalty": 1.5}, {**WINDOW, "length_penalty": 2.0}]
DECODING += [{**WINDOW, "no_repeat_content_words": True}]  # no content word twice, the rest free
DEGENERATE_MAX = 10.0  # the decoding chosen: the best ROUGE-1 among those with at most this % degenerate headlines
# no dropout on BERT2BERT's attention weights, with which CPU SDPA falls back to its unfused kernel (2x slower here)
BERT2BERT_DROPOUT = {"encoder_attention_probs_dropout_prob": 0.0, "decoder_attention_probs_dropout_prob": 0.0}
# what the benchmark chooses or sets per run, not takes from the argument file (which holds the choice)
TUNED = {"model_name_or_path", "output_dir", "label_smoothing_factor", "min_target_length", "generation_max_length"}
TUNED |= GREEDY.keys() | {"repetition_penalty", "no_repeat_content_words", "whole_words", "end_on_content_words"}
# decoding flags too: rows decode by DECODING or --chosen
TUNED |= {"source_span_bonus", "copied_punctuation", "stay_on_span", "headline_style", "rerank_beams"}
# batches of articles of about the same length: random batches of 16 pad to 2.4x their tokens at 2,048
GROUPED = {"max_source_length": 2048, "train_sampling_strategy": "group_by_length"}
# a row: (label, its family (None: lead-k), the settings it changes)
ROWS = {
    "lead": ("lead-k (first k words)", None, {}),
    "fastformer-512": ("Fastformer, warm-started, source 512", "fastformer", {}),
    "fastformer-1024": ("Fastformer, warm-started, source 1,024", "fastformer", {"max_source_length": 1024}),
    "fastformer-2048": ("Fastformer, warm-started, source 2,048", "fastformer", GROUPED),
    "bert2bert-512": ("BERT2BERT (softmax), warm-started, source 512", "bert2bert", {}),
}


def parse_args(argv=None):
    parser = arguments(__doc__, threads=None)
    parser.add_argument("--rows", nargs="*", choices=list(ROWS), default=list(ROWS), help="none: the tables only")
    parser.add_argument(
        "--compare",
        nargs="*",
        default=[],
        metavar="FILE[#KEY.KEY]",
        help="other records' test predictions to tabulate beside the rows (a JSON file, the keys to the dict that "
        "holds them), e.g. docs/results_summarization/issue34-copy-head.json#rows.fastformer",
    )
    parser.add_argument("--recipe", type=Path, default=REPO / "configs" / "summarization" / "news_headlines.json")
    parser.add_argument("--converted", default="runs/minilm-fastformer-seq2seq", help="the Fastformer family's start")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--unlabeled", nargs="*", default=[], help="FILE:FIELD of texts to pretrain on too")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality")
    parser.add_argument("--records", type=Path, default=DOCS / "results_summarization")
    parser.add_argument(
        "--chosen",
        help='JSON {"training": a lever\'s settings, "decoding": a decoding}, as a row record\'s "chosen": the rows '
        "train and decode with it instead of tuning their family",
    )
    args = parser.parse_args(argv)
    if args.chosen is not None:
        try:
            args.chosen = json.loads(args.chosen)
        except json.JSONDecodeError as error:
            parser.error(f"--chosen is not JSON: {error}")
        chosen = args.chosen if isinstance(args.chosen, dict) else {}
        training, decoding = chosen.get("training"), chosen.get("decoding")
        if not (isinstance(training, dict) and training.keys() >= LEVER_BASE.keys() and isinstance(decoding, dict)):
            parser.error(f"--chosen needs a 'training' with {sorted(LEVER_BASE)} and a 'decoding', got {args.chosen}")
    args.folder = args.runs / "headlines"
    # the argument file without what the tuning chooses or where a run writes, and its splits' articles
    args.base = {key: value for key, value in read_json(args.recipe).items() if key not in TUNED}
    files = {name: REPO / args.base[f"{name}_file"] for name in SPLITS}
    args.splits = {name: [json.loads(line) for line in path.read_text().splitlines()] for name, path in files.items()}
    return args


def length_window(tokenizer, targets: list[str], percentiles: tuple[float, float] = (5, 95)) -> dict[str, int]:
    """Generation bounds from training targets: `min_target_length` (min_new_tokens) and `generation_max_length`
    (max_length, the decoder start included) at the given percentiles of the targets' lengths in `tokenizer`'s
    tokens, the end of sequence counted; run_summarization.py's flags of the same names take them."""
    tokens = tokenizer(targets, add_special_tokens=False)["input_ids"]
    low, high = np.percentile([len(ids) + 1 for ids in tokens], percentiles)
    return {"min_target_length": int(low), "generation_max_length": int(np.ceil(high)) + 1}


def choose_k(baseline, documents: list[str], references: list[str], ks=range(1, 41)) -> tuple[int, dict]:
    """The k of `baseline(text, k)` (`lead_words`, `keyword_headline`) with the best ROUGE-1 on `documents` against
    `references` (a validation split), and every k's scores."""
    grid = {k: rouge([baseline(text, k) for text in documents], references) for k in ks}
    return max(grid, key=lambda k: grid[k]["rouge1"]), grid


def run(args, settings: dict) -> dict:
    """scripts/run_summarization.py with `settings`, once: its metrics and test predictions, the model's own and, where
    the settings post-edit them (headline_style, rerank_beams), the edited ones."""

    def outputs(folder: Path) -> dict:
        found = {"metrics": read_json(folder / "all_results.json")}
        for key, name in (("predictions", "generated_predictions.txt"), ("edited", "edited_predictions.txt")):
            found[key] = (folder / name).read_text().splitlines() if (folder / name).exists() else None
        return found

    command = [sys.executable, str(SCRIPTS / "run_summarization.py"), *flags(settings)]
    return harness.run_script(command, Path(settings["output_dir"]), outputs)


def fastformer_start(converted: str, cross_attention_init: str, source: str | None = None, copy: bool = False):
    """The converted checkpoint (with a new copy head with `copy`), its cross-attention as converted where
    conversion.json says so, else copied from the source BERT's self-attention ("self_attention") or a new model's
    ("random")."""
    torch.manual_seed(0)
    if copy:
        config = FastformerCopyConfig.from_pretrained(converted)
        model = FastformerCopyForConditionalGeneration.from_pretrained(converted, config=config)
    else:
        model = FastformerForConditionalGeneration.from_pretrained(converted)
    conversion = read_json(Path(converted) / "conversion.json", {})
    as_converted = cross_attention_init == conversion.get("cross_attention_init", "random")
    if cross_attention_init == "self_attention" and not as_converted:
        copy_bert_cross_attention(BertModel.from_pretrained(source or conversion["source"]), model.get_decoder().layers)
    elif not as_converted:  # a new model's weights (transformers' initialization leaves loaded weights as they are)
        new = {key: value for key, value in type(model)(model.config).state_dict().items() if ".cross_attention" in key}
        model.load_state_dict(new, strict=False)
    return model, AutoTokenizer.from_pretrained(converted)


def pretraining(base: dict, model: str, train_file: str, output_dir: str) -> dict:
    """The pseudo-summary stage: `base` with PRETRAIN on `train_file` only, the encoder run in every step."""
    stages = {"do_eval": False, "do_predict": False, "validation_file": None, "test_file": None}
    files = {"model_name_or_path": model, "train_file": train_file, "output_dir": output_dir}
    return {**base, **PRETRAIN, **files, **stages, "cache_encoder_states": False}


def train(args, family: str, lever: dict, row: dict | None = None) -> dict:
    """The headline run of `family` with a lever's settings, after its first stage and before its second where it
    has them, scored on the validation split with greedy search; `row`: a table row's training settings."""
    base, folder, init, copy = args.base, args.folder / family, lever["cross_attention_init"], lever["copy_mechanism"]
    start = "-".join([family, init, *["copy"] * copy])  # the family's start with that cross-attention and head
    model = args.folder / "starts" / start  # saved once
    if not (model / "config.json").exists():
        if family == "bert2bert":
            loaded = bert2bert_model(args.source or minilm(), init, copy_mechanism=copy, **BERT2BERT_DROPOUT)
        else:
            loaded = fastformer_start(args.converted, init, args.source, copy)
        for part in loaded:  # the model and its tokenizer
            part.save_pretrained(model)
    output = folder / "-".join([harness.cell({**lever, "continue": None}), *map(str, (row or {}).values())])
    changes = {key: value for key, value in lever.items() if key not in (*LEVER_BASE, "continue")}
    headline = {**base, **changes, **(row or {}), **GREEDY, "do_predict": False, "test_file": None}
    stages = [{**headline, "output_dir": str(output)}]
    if lever["pretrain"]:  # make_pseudo_summaries.py's pairs of the training articles and the unlabeled texts
        name = harness.cell(lever["pretrain"])
        pairs = args.folder / "pseudo_summaries" / name / "pairs.jsonl"
        texts = [f"{REPO / base['train_file']}:document", *args.unlabeled]
        held_out = [f"{REPO / base[f'{split}_file']}:document" for split in ("validation", "test")]
        clean = {"clean_sources": base.get("clean_sources")}  # as the headline runs read their articles
        pairing = {"output": pairs, **lever["pretrain"], **clean, "texts": texts, "held_out": held_out}
        command = [sys.executable, str(SCRIPTS / "make_pseudo_summaries.py"), *flags(pairing)]
        harness.run_script(command, pairs.parent, lambda folder: {})
        output_dir = str(folder / "pretrain" / f"{start}-{name}")  # the copy head learns here too
        stages.insert(0, pretraining(base, str(model), str(pairs), output_dir))
    if lever.get("continue"):  # the encoder states of layers in training cannot be cached
        cache = {"cache_encoder_states": False} if lever["continue"].get("train_encoder_layers") else {}
        then = {**lever["continue"], **cache, "output_dir": f"{output}-then-{harness.cell(lever['continue'])}"}
        stages.append({**headline, **then})
    runs = []
    for stage in stages:  # each from the model of the one before
        runs.append(run(args, {**stage, "model_name_or_path": str(model)}))
        before, model = model, stage["output_dir"]
    seconds, commands = sum(found["metrics"]["train_runtime"] for found in runs), [found["command"] for found in runs]
    return {**runs[-1], "commands": commands, "train_seconds": seconds, "start": str(before), "output_dir": model}


def decode(args, model: str, decoding: dict, output_dir: Path, test: bool = False) -> dict:
    """`model` scored on the validation split (and with `test` the test split predicted) with `decoding`."""
    settings = {**args.base, **{key: value for key, value in decoding.items() if key != "length_window"}}
    if decoding.get("length_window"):  # in the model's tokens
        headlines = [row["summary"] for row in args.splits["train"]]
        settings |= length_window(AutoTokenizer.from_pretrained(model), headlines)
    settings |= {"model_name_or_path": model, "do_train": False, "do_predict": test, "output_dir": str(output_dir)}
    return run(args, settings if test else {**settings, "test_file": None})


def tune(args, family: str) -> dict:
    """The recipe and the levers in turn, then the decodings, on the validation split."""
    best, best_run, levers = dict(LEVER_BASE), None, []
    documents = [row["document"] for row in args.splits["validation"][:32]]
    for lever, changes in {"recipe": {}, **LEVERS}.items():
        settings = {**best, **changes}
        found = train(args, family, settings)
        result = {"lever": lever, "settings": settings, "rouge1": found["metrics"]["eval_rouge1"]}
        kept = best_run is None or result["rouge1"] > best_run["metrics"]["eval_rouge1"]
        if (changes.get("continue") or {}).get("train_encoder_layers"):  # kept only while the states stay apart
            result["spread"] = []
            for model in (found["start"], found["output_dir"]):  # the encoder's, source 256
                encoder = AutoModelForSeq2SeqLM.from_pretrained(model).get_encoder().eval()
                tokenize = dict(max_length=min(256, encoder.config.max_position_embeddings), truncation=True)
                inputs = AutoTokenizer.from_pretrained(model)(documents, **tokenize, padding=True, return_tensors="pt")
                result["spread"].append(token_state_spread(encoder, **inputs))
            kept = kept and result["spread"][1] >= SPREAD_KEPT * result["spread"][0]
        levers.append({**result, "train_seconds": found["train_seconds"], "kept": kept})
        best, best_run = (settings, found) if kept else (best, best_run)
    decodings = []
    for decoding in DECODING:  # greedy search is the best run's own score
        output = args.folder / family / "decoding" / harness.cell(decoding)
        scored = best_run if decoding == GREEDY else decode(args, best_run["output_dir"], decoding, output)
        decodings.append({"setting": decoding, "rouge1": scored["metrics"]["eval_rouge1"]})
        decodings[-1]["degenerate"] = scored["metrics"].get("eval_degenerate")  # run_summarization's share
    readable = [run for run in decodings if (run["degenerate"] or 0) <= DEGENERATE_MAX] or decodings
    chosen = max(readable, key=lambda run: run["rouge1"])["setting"]
    return {"levers": levers, "decoding": decodings, "chosen": {"training": best, "decoding": chosen}}


def sources(args, split: str) -> list[str]:
    """A split's articles as the models read them (the recipe's clean_sources)."""
    clean = clean_source if args.base.get("clean_sources") else str
    return [clean(row["document"]) for row in args.splits[split]]


def styled_lead(text: str, k: int) -> str:
    """lead-k in headline style (`headline_style`): the lead with the edit that run_summarization.py's
    --headline_style makes to a model's headlines."""
    return headline_style(lead_words(text, k))


# the untrained baselines beside lead-k: (record key, label, the baseline)
BASELINES = (
    ("keywords", "keywords (k most frequent content words)", keyword_headline),
    ("styled_lead", "lead-k in headline style", styled_lead),
)


def lead(args) -> dict:
    """The untrained baselines, each with the k (1 to 40) of the best validation ROUGE-1: lead-k, the article's first k
    words (as ROUGE reads them, `lead_words`); the keywords, its k most frequent content words in article order
    (`keyword_headline`): what a summarizer that learned keyword extraction and no English would score; and lead-k in
    headline style (`styled_lead`)."""
    validation, test = sources(args, "validation"), sources(args, "test")
    references = [row["summary"] for row in args.splits["validation"]]
    test_references = [row["summary"] for row in args.splits["test"]]
    found = {}
    for name, baseline in (("lead", lead_words), *((key, function) for key, _, function in BASELINES)):
        k, grid = choose_k(baseline, validation, references)
        predictions = [baseline(text, k) for text in test]
        scores = {"test": rouge(predictions, test_references), "predictions": predictions}
        found[name] = {"validation_grid": {str(k): scores for k, scores in grid.items()}, "chosen": {"k": k}, **scores}
    return {**found.pop("lead"), **{key: {"label": label, **found[key]} for key, label, _ in BASELINES}}


def headlines(args, family: str, settings: dict) -> dict:
    """A row: its family's tuning (or --chosen), a training run with the choice, the test split predicted with its
    decoding (its time per article: the encoder, generation and the loss forward); the scores are the model's own
    predictions', and those the decoding's post-edit makes of them are kept apart ("edited")."""
    tuning = tune(args, family) if args.chosen is None else {}
    chosen = tuning.get("chosen", args.chosen)
    trained = train(args, family, chosen["training"], settings)
    output = Path(trained["output_dir"]) / "test"
    predicted = decode(args, trained["output_dir"], {**chosen["decoding"], **settings}, output, test=True)
    predictions, metrics = predicted["predictions"], predicted["metrics"]
    references = [row["summary"] for row in args.splits["test"]]
    found = dict(chosen=chosen, recipe={**args.base, **settings}, test=rouge(predictions, references))
    found |= {"tuning": tuning} if tuning else {}
    found |= dict(commands=[*trained["commands"], predicted["command"]], validation_rouge1=metrics["eval_rouge1"])
    found |= dict(train_seconds=trained["train_seconds"], decode_ms=1000 * metrics["predict_runtime"] / len(references))
    if predicted.get("edited") is not None:
        found["edited"] = {"test": rouge(predicted["edited"], references), "predictions": predicted["edited"]}
    return {**found, "predictions": predictions}


def tables(args, records: dict) -> list[str]:
    """Each row's test scores (ROUGE-1, -2, -L; words per headline as ROUGE counts them; copied: the share that is a
    training headline; `headline_quality` with the non-words against the training text; lead-k at the row's own
    length, and lead-k in headline style at about its length), the baselines' rows (lead-k, the keywords and lead-k in
    headline style at validation's best k), a row's post-edited predictions after it, and the references' own last;
    each family's tuning; 30 test headlines side by side."""
    training = {" ".join(headline_words(row["summary"])) for row in args.splits["train"]}
    texts = (f"{row['document']} {row['summary']}" for row in args.splits["train"])
    vocabulary = {word for text in texts for word in headline_words(text)}  # the training text's words
    references, documents = [row["summary"] for row in args.splits["test"]], sources(args, "test")
    listed = {}
    for key, record in records.items():  # a row's post-edited predictions follow it, a row of their own
        listed[key] = record
        if "edited" in record:
            listed[f"{key}-edited"] = {"label": f"{record['label']}, post-edited", **record["edited"]}
    for key, _, _ in BASELINES:
        if key in records.get("lead", {}):
            listed[key] = records["lead"][key]
    styled = {k: [styled_lead(text, k) for text in documents] for k in range(1, 41)}
    styled_words = {k: statistics.fmean(len(headline_words(text)) for text in leads) for k, leads in styled.items()}
    scores, tuned = [], {}
    for key, found in {**listed, "reference": {"label": "reference headlines", "predictions": references}}.items():
        row = {"model": found["label"], **found.get("test", {})}
        row["words"] = statistics.fmean(len(headline_words(text)) for text in found["predictions"])
        row["copied"] = statistics.fmean(" ".join(headline_words(text)) in training for text in found["predictions"])
        row |= headline_quality(found["predictions"], documents, vocabulary=vocabulary)
        # lead-k at the row's own length: the trivial baseline at equal length
        row["its length's lead-k"] = k = round(row["words"])
        same = rouge([lead_words(text, k) for text in documents], references)
        row |= {f"lead-k {name}": same[name] for name in ("rouge1", "rouge2", "rougeL")}
        # lead-k in headline style at about the row's length: the k whose styled leads' mean words are nearest
        row["its length's styled lead-k"] = k = min(styled_words, key=lambda k: abs(styled_words[k] - row["words"]))
        same = rouge(styled[k], references)
        row |= {f"styled lead-k {name}": same[name] for name in ("rouge1", "rouge2", "rougeL")}
        row["training min"] = found["train_seconds"] / 60 if "train_seconds" in found else ""
        scores.append({**row, "ms per summary": found.get("decode_ms", ""), "chosen": found.get("chosen", "")})
        if "tuning" in found:  # a family's rows share its tuning
            tuned[ROWS[key][1]] = found["tuning"]
    steps = []
    for family, tuning in tuned.items():
        steps += [{"family": family, **run} for run in tuning["levers"] + tuning["decoding"]]
    samples = sorted(random.Random(0).sample(range(len(references)), min(30, len(references))))
    rows = [{"reference": references[i], **{key: listed[key]["predictions"][i] for key in listed}} for i in samples]
    return [harness.rows_table(scores), harness.rows_table(steps), harness.rows_table(rows)]


def main(argv=None):
    args = parse_args(argv)
    for key in args.rows:
        label, family, settings = ROWS[key]
        found = lead(args) if family is None else headlines(args, family, settings)
        write_json(args.records / f"{key}.json", {"machine": machine(), "label": label, **found})
    records = {key: read_json(args.records / f"{key}.json") for key in ROWS if (args.records / f"{key}.json").exists()}
    records |= {spec: compared(spec) for spec in args.compare}
    print("\n\n".join(tables(args, records)))


def compared(spec: str) -> dict:
    """A record given as FILE#KEY.KEY, as a row of the tables: its test scores and predictions (and its post-edited
    ones, "edited", where it has them), labelled by `spec`."""
    path, _, keys = spec.partition("#")
    found = read_json(REPO / path)
    for key in filter(None, keys.split(".")):
        found = found[key]
    test = found.get("test_rouge", found.get("test", {}))
    label = Path(path).stem + (f"#{keys}" if keys else "")
    edited = {"edited": found["edited"]} if "edited" in found else {}  # tabulated as a row of its own after it
    return {"label": label, "test": test, "predictions": found["predictions"], **edited}


if __name__ == "__main__":
    main()
