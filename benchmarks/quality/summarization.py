"""The summarization table of docs/RESULTS.md: news articles -> headlines (data/news_headlines, the whole
2,924 / 365 / 366 split), every model tuned on the validation split, scored once on the test split (report.py
describes the rows and the recipe).

    python -m benchmarks.quality.summarization                  # every row, then docs/RESULTS.md
    python -m benchmarks.quality.summarization --rows lead fastformer-512

Every trained row of specs.ROWS follows configs/summarization/news_headlines.json with the settings it changes:
1. training: each setting of the row's grid at the cheaper specs.PROXY settings, greedy decoding;
2. decoding: each of specs.DECODING on the validation split, with the best model of step 1;
3. the run itself with the best of both (the best epoch kept), then the test split.
A model family (specs.SummarizationRow.family) shares steps 1 and 2: a row reads back its family's tuning recorded
for another row under the current recipe. Finished steps are stored in RUNS/headlines and not repeated; the results
are copied to docs/results_summarization.json, which a fresh clone starts from.
"""

import argparse
import shutil
import sys
from pathlib import Path

from transformers import AutoTokenizer, EncoderDecoderModel

from benchmarks.harness import (
    DOCS,
    REPO,
    SCRIPTS,
    arguments,
    flags,
    minilm,
    read_json,
    read_jsonl,
    recorded_command,
    relative,
    run_stored,
    write_json,
)
from benchmarks.quality.report import summarization_results, write_report
from benchmarks.quality.specs import BERT2BERT_DROPOUT, DECODING, LEAD_WORDS, PROXY, ROWS
from fastformer.summarization import rouge

RECIPE = REPO / "configs" / "summarization" / "news_headlines.json"
DATA = REPO / "data" / "news_headlines"


def grid_name(setting: dict) -> str:
    """A training setting's folder and name: lr0.001, or lr0.0001-encoder-trained."""
    return f"lr{setting['learning_rate']:g}" + ("-encoder-trained" if setting.get("freeze_encoder") is False else "")


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the argument file every trained row follows")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality", help="runs in RUNS/headlines")
    parser.add_argument("--results", type=Path, default=DOCS / "RESULTS.md", help="the report to rewrite")
    parser.add_argument("--data", type=Path, default=DATA, help="train/validation/test.jsonl with document, summary")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more script flags (e.g. for a test)")
    args = parser.parse_args(argv)
    args.folder = args.runs / "headlines"
    return args


def lead(args) -> dict:
    """lead-k: k from LEAD_WORDS with the best validation ROUGE-1, then the test split."""
    splits = {split: read_jsonl(args.data / f"{split}.jsonl") for split in ("validation", "test")}

    def leads(rows, k):
        return [" ".join(row["document"].split()[:k]) for row in rows]

    validation = {k: rouge(leads(splits["validation"], k), [row["summary"] for row in splits["validation"]])
                  for k in LEAD_WORDS}  # fmt: skip
    best = max(validation, key=lambda k: validation[k]["rouge1"])
    predictions = leads(splits["test"], best)
    return {
        "validation_grid": {str(k): found for k, found in validation.items()},
        "chosen": {"k": best},
        "test": rouge(predictions, [row["summary"] for row in splits["test"]]),
        "predictions": predictions,
    }


def script_command(args, settings: dict) -> list[str]:
    """scripts/run_summarization.py with `settings` (+ --extra)."""
    return [sys.executable, str(SCRIPTS / "run_summarization.py"), *flags(settings), *args.extra]


def run_script(args, settings: dict, what: str) -> dict:
    """scripts/run_summarization.py with `settings` (+ --extra); its all_results.json, trainer_state.json and
    test predictions. Stored: a finished run of the same command is read back, not repeated."""

    def result(folder, seconds) -> dict:
        state = folder / "trainer_state.json"
        predictions = folder / "generated_predictions.txt"
        for checkpoint in folder.glob("checkpoint-*"):  # the kept best epoch is in the folder itself
            shutil.rmtree(checkpoint)
        return {
            "metrics": read_json(folder / "all_results.json"),
            "log_history": read_json(state, {"log_history": []})["log_history"],
            "predictions": predictions.read_text().splitlines() if predictions.exists() else None,
            "wall_seconds": seconds,
        }

    command = script_command(args, settings)
    return run_stored(command, Path(settings["output_dir"]), result, what, in_process=args.in_process)


def bert2bert_model(source: str | None = None):
    """transformers' EncoderDecoderModel with encoder and decoder from `source` (default: all-MiniLM-L6-v2), its
    special tokens set from the tokenizer; returns the model and the tokenizer."""
    source = source or minilm()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(source, source, **BERT2BERT_DROPOUT)
    special = {"decoder_start_token_id": tokenizer.cls_token_id, "bos_token_id": tokenizer.cls_token_id,
               "eos_token_id": tokenizer.sep_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    for name, value in special.items():
        setattr(model.config, name, value)
    model.generation_config.update(**special)
    return model, tokenizer


def bert2bert(args) -> str:
    """The BERT2BERT row's starting folder (bert2bert_model from --source), saved once."""
    folder = args.folder / "bert2bert-init"
    if not (folder / "config.json").exists():
        model, tokenizer = bert2bert_model(args.source)
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    return relative(folder)


def recipe(args, name: str) -> dict:
    settings = {**read_json(args.recipe), **ROWS[name].settings}
    if settings["model_name_or_path"] == "BERT2BERT":
        settings["model_name_or_path"] = bert2bert(args)
    if args.data != DATA:
        settings |= {f"{split}_file": str(args.data / f"{split}.jsonl") for split in ("train", "validation", "test")}
    return settings


def scored(found: dict) -> dict:
    """A tuning run as the results keep it: its setting and validation ROUGE-1."""
    return {"setting": found["setting"], "rouge1": found["metrics"]["eval_rouge1"]}


def final_settings(args, row: str, chosen: dict) -> dict:
    """Step 3's settings: the recipe with the row's changes and the settings chosen on validation."""
    return {**recipe(args, row), **chosen, "output_dir": str(args.folder / row)}


def stored_tuning(args, row: str, results: dict) -> dict | None:
    """The tuning of the row's family that `results` records for another row of it, if it is what the tuning would
    run now: that row's recorded command is the one the current recipe gives it, and its training settings and
    decodings are the row's grid and DECODING. Otherwise None."""
    family = ROWS[row].family
    siblings = [name for name in results if name != row and name in ROWS and ROWS[name].family == family]
    for name in siblings:
        stored = results[name]
        tuning = stored.get("tuning")
        if tuning is None:
            continue
        command = recorded_command(script_command(args, final_settings(args, name, stored["chosen"])))
        grids = ([run["setting"] for run in tuning["training"]], [run["setting"] for run in tuning["decoding"]])
        if command == stored["command"] and grids == (ROWS[row].grid, DECODING):
            return tuning
    return None


def tune(args, row: str) -> dict:
    """Steps 1 and 2 for the row's family: the training setting, then the decoding, on the validation split."""
    family = ROWS[row].family
    folder = args.folder / "tuning" / family
    base = recipe(args, row)
    base.update({**PROXY, "do_predict": False, "test_file": None, "early_stopping_patience": None})
    runs = {}
    for setting in ROWS[row].grid:
        name = grid_name(setting)
        settings = {**base, **setting, "output_dir": str(folder / name)}
        runs[name] = {"setting": setting, **run_script(args, settings, f"{family}: {name} (proxy)")}
    best_training = max(runs, key=lambda name: runs[name]["metrics"]["eval_rouge1"])
    decoding = {}
    for setting in DECODING:
        name = "-".join(f"{key}{value}" for key, value in setting.items())
        settings = {
            **base, **setting, "model_name_or_path": str(folder / best_training), "do_train": False,
            "output_dir": str(folder / "decoding" / name), "load_best_model_at_end": False, "eval_strategy": "no",
        }  # fmt: skip
        decoding[name] = {"setting": setting, **run_script(args, settings, f"{family}: decoding {name}")}
    best_decoding = max(decoding.values(), key=lambda found: found["metrics"]["eval_rouge1"])["setting"]
    return {
        "training": [scored(found) for found in runs.values()],
        "decoding": [scored(found) for found in decoding.values()],
        "chosen": {**runs[best_training]["setting"], **best_decoding},
    }


def train(args, row: str, results: dict) -> dict:
    """The row's tuning (a family's is run once: recorded for another of its rows, it is read back), its run and
    test scores."""
    tuning = stored_tuning(args, row, results) or tune(args, row)
    settings = final_settings(args, row, tuning["chosen"])
    result = run_script(args, settings, ROWS[row].label)
    predictions = result["predictions"]
    references = [found["summary"] for found in read_jsonl(args.data / "test.jsonl")]
    if predictions is None or len(predictions) != len(references):
        sys.exit(f"summarization.py: error: {settings['output_dir']} has no prediction for every test article")
    metrics = result["metrics"]
    evaluations = [entry for entry in result["log_history"] if "eval_rouge1" in entry]
    return {
        "tuning": tuning,
        "chosen": tuning["chosen"],
        "command": result["command"],
        "test": rouge(predictions, references),
        "validation_curve": [(entry["epoch"], entry["eval_rouge1"]) for entry in evaluations],
        # training time without the per-epoch validation; prediction time per test article (generation included)
        "train_seconds": metrics["train_runtime"] - sum(entry["eval_runtime"] for entry in evaluations),
        "decode_ms": 1000 * metrics["test_runtime"] / len(predictions),
        "predictions": predictions,
    }


def main():
    args = parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    results_file = args.folder / "results.json"
    results = summarization_results(args.runs, args.results.parent)  # what ran before, here or as docs/ records it
    for row in args.rows:
        results[row] = {"label": ROWS[row].label, **(lead(args) if row == "lead" else train(args, row, results))}
        write_json(results_file, results)
        print(f"{ROWS[row].label}: test {results[row]['test']}", flush=True)
    write_report(args.runs, args.results, headlines_data=args.data)


if __name__ == "__main__":
    main()
