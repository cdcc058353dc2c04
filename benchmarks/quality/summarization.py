"""The summarization table of docs/RESULTS.md: news articles -> headlines (data/news_headlines, the whole
2,924 / 365 / 366 split), every model family tuned on the validation split, scored once on the test split
(report.py describes the rows and the recipe).

    python -m benchmarks.quality.summarization --rows lead fastformer-512 bert2bert-512   # the family tunings
    python -m benchmarks.quality.summarization --rows fastformer-2048                      # one more row

Every trained row follows configs/summarization/news_headlines.json (float32, the encoder frozen and its states
computed once per article) with the settings it changes. A model family (specs.SummarizationRow.family: the
Fastformer rows, BERT2BERT) is tuned once, at the recipe's source length, on the validation split:
1. levers: from specs.LEVER_BASE, each of specs.LEVERS in turn is added to the best settings so far and kept if it
   raises validation ROUGE-1 (greedy decoding): the start's cross-attention, a pseudo-summary pretraining stage,
   training settings;
2. decoding: each of specs.DECODING on the validation split, with the best model of step 1.
A row then trains with the family's chosen settings at its own source length (the family's best run itself at the
recipe's) and predicts the test split with the chosen decoding. Finished runs are stored in RUNS/headlines and not
repeated; a row reads back its family's tuning recorded for another row under the current recipe; the results are
copied to docs/results_summarization.json, which a fresh clone starts from.
"""

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, BertModel, EncoderDecoderModel

from benchmarks.harness import (
    DOCS,
    REPO,
    SCRIPTS,
    arguments,
    flags,
    minilm,
    read_json,
    read_jsonl,
    relative,
    run_stored,
    write_json,
)
from benchmarks.quality.report import summarization_results, write_report
from benchmarks.quality.specs import (
    BERT2BERT_DROPOUT,
    DECODING,
    LEAD_WORDS,
    LEVER_BASE,
    LEVER_DECODING,
    LEVERS,
    PRETRAIN,
    ROWS,
    SPREAD_KEPT,
)
from fastformer import FastformerForConditionalGeneration
from fastformer.conversion import copy_bert_cross_attention
from fastformer.summarization import rouge

RECIPE = REPO / "configs" / "summarization" / "news_headlines.json"
DATA = REPO / "data" / "news_headlines"
UNLABELED = REPO / "data" / "distillation" / "train.jsonl.gz"
CONVERTED = "runs/minilm-fastformer-seq2seq"  # the README's seq2seq conversion
# what the benchmark chooses (or sets per run) rather than takes from the argument file, which holds the choice
TUNED = {"model_name_or_path", "output_dir", "label_smoothing_factor", "min_target_length", "generation_max_length",
         *LEVER_DECODING}  # fmt: skip


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--rows", nargs="+", choices=list(ROWS), default=list(ROWS))
    parser.add_argument("--recipe", type=Path, default=RECIPE, help="the argument file every trained row follows")
    parser.add_argument("--converted", default=CONVERTED, help="the Fastformer rows' converted seq2seq checkpoint")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality", help="runs in RUNS/headlines")
    parser.add_argument("--results", type=Path, default=DOCS / "RESULTS.md", help="the report to rewrite")
    parser.add_argument("--data", type=Path, default=DATA, help="train/validation/test.jsonl with document, summary")
    parser.add_argument("--unlabeled", nargs="+", default=[f"{UNLABELED}:text"],
                        help="FILE:FIELD of the unlabeled texts for pseudo-summaries (with the training articles)")
    parser.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the script runs")
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


def script_command(args, script: str, settings: dict) -> list[str]:
    """scripts/`script` with `settings` (+ --extra)."""
    return [sys.executable, str(SCRIPTS / script), *flags(settings), *args.extra]


def run_script(args, settings: dict, what: str) -> dict:
    """scripts/run_summarization.py with `settings` (+ --extra); its all_results.json and test predictions.
    Stored: a finished run of the same command is read back, not repeated."""

    def result(folder, seconds) -> dict:
        predictions = folder / "generated_predictions.txt"
        for checkpoint in folder.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
        return {
            "metrics": read_json(folder / "all_results.json"),
            "predictions": predictions.read_text().splitlines() if predictions.exists() else None,
            "wall_seconds": seconds,
        }

    command = script_command(args, "run_summarization.py", settings)
    env = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else None
    return run_stored(command, Path(settings["output_dir"]), result, what, env=env, in_process=args.in_process)


def save_start(model, tokenizer, folder: Path) -> str:
    folder.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return relative(folder)


def bert2bert_model(source: str | None = None, cross_attention_init: str = "random"):
    """transformers' EncoderDecoderModel with encoder and decoder from `source` (default: all-MiniLM-L6-v2), its
    special tokens set from the tokenizer; with `cross_attention_init="self_attention"` each decoder layer's
    cross-attention starts as a copy of its self-attention (query, key, value, output). Returns the model and the
    tokenizer."""
    source = source or minilm()
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(source, source, **BERT2BERT_DROPOUT)
    special = {"decoder_start_token_id": tokenizer.cls_token_id, "bos_token_id": tokenizer.cls_token_id,
               "eos_token_id": tokenizer.sep_token_id, "pad_token_id": tokenizer.pad_token_id}  # fmt: skip
    for name, value in special.items():
        setattr(model.config, name, value)
    model.generation_config.update(**special)
    if cross_attention_init == "self_attention":
        for layer in model.decoder.bert.encoder.layer:
            layer.crossattention.load_state_dict(layer.attention.state_dict())
    return model, tokenizer


def fastformer_start(converted: str, cross_attention_init: str, source: str | None = None):
    """The converted seq2seq checkpoint with its cross-attention as `cross_attention_init` asks: as converted when
    its conversion.json says so, else re-initialized ("random", the model's own initialization) or copied from the
    conversion's source BERT ("self_attention", as `convert_bert` does). Returns the model and the tokenizer."""
    model = FastformerForConditionalGeneration.from_pretrained(converted)
    tokenizer = AutoTokenizer.from_pretrained(converted)
    conversion = read_json(Path(converted) / "conversion.json", {})
    if conversion.get("cross_attention_init", "random") != cross_attention_init:
        layers = model.get_decoder().layers
        if cross_attention_init == "random":
            randomize_cross_attention(layers, model.config.initializer_range)
        else:
            copy_bert_cross_attention(BertModel.from_pretrained(source or conversion["source"]), layers)
    return model, tokenizer


@torch.no_grad()
def randomize_cross_attention(layers, std: float) -> None:
    """The cross-attention of each decoder layer (and its output sub-layer) as a new model initializes it: linear
    weights ~ N(0, std) with zero biases, layer norms at one and zero. torch's own init functions: transformers'
    `_init_weights` leaves loaded weights as they are."""
    torch.manual_seed(0)
    for layer in layers:
        for module in (*layer.cross_attention.modules(), *layer.cross_attention_output.modules()):
            if isinstance(module, torch.nn.Linear):
                torch.nn.init.normal_(module.weight, std=std)
                torch.nn.init.zeros_(module.bias)
            elif isinstance(module, torch.nn.LayerNorm):
                torch.nn.init.ones_(module.weight)
                torch.nn.init.zeros_(module.bias)
        if getattr(layer.cross_attention, "context_weight", None) is not None:
            torch.nn.init.normal_(layer.cross_attention.context_weight, std=std)


def start_folder(args, family: str, cross_attention_init: str, converted: str) -> str:
    """The family's starting checkpoint with the cross-attention `cross_attention_init`, saved once."""
    folder = args.folder / "starts" / f"{family}-{cross_attention_init}"
    if not (folder / "config.json").exists():
        if family == "bert2bert":
            model, tokenizer = bert2bert_model(args.source, cross_attention_init)
        else:
            if read_json(Path(converted) / "conversion.json", {}).get("cross_attention_init") == cross_attention_init:
                return converted
            model, tokenizer = fastformer_start(converted, cross_attention_init, args.source)
        return save_start(model, tokenizer, folder)
    return relative(folder)


def pseudo_summaries(args, mode: str) -> str:
    """make_pseudo_summaries.py's pairs (`mode`) from --unlabeled and the training articles, never from a
    validation or test article; written once."""
    output = args.folder / "pseudo_summaries" / f"{mode}.jsonl"
    if not output.exists():
        texts = [f"{args.data / 'train.jsonl'}:document", *args.unlabeled]
        held_out = [f"{args.data / f'{split}.jsonl'}:document" for split in ("validation", "test")]
        command = script_command(args, "make_pseudo_summaries.py", {})[:2]
        command += ["--output", str(output), "--mode", mode, "--texts", *texts, "--held_out", *held_out]
        process = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
        if process.returncode != 0:
            sys.exit(f"error: make_pseudo_summaries.py failed:\n{process.stderr[-4000:]}")
    return relative(output)


def recipe(args) -> dict:
    """The argument file without what the tuning chooses (the start, the decoding, the levers' settings) or where
    a run writes."""
    settings = {key: value for key, value in read_json(args.recipe).items() if key not in TUNED}
    if args.data != DATA:
        settings |= {f"{split}_file": str(args.data / f"{split}.jsonl") for split in ("train", "validation", "test")}
    return settings


def family_of(row: str) -> str:
    return ROWS[row].family


def setting_name(setting: dict) -> str:
    """A folder name for a lever setting: its values in order, e.g. self_attention-pretrain-lead-ls0.1."""
    parts = []
    for key, value in setting.items():
        short = {"cross_attention_init": "", "pretrain": "pretrain-", "label_smoothing_factor": "ls",
                 "learning_rate": "lr", "num_train_epochs": "epochs",
                 "train_encoder_layers": "layers"}.get(key, key)  # fmt: skip
        parts.append(f"{short}{value:g}" if isinstance(value, float) else f"{short}{value}")
    return "-".join(parts)


def pretraining(base: dict, start: str, train_file: str, output_dir: str) -> dict:
    """The pseudo-summary pretraining stage's settings: `base` (the recipe) with specs.PRETRAIN, trained on
    `train_file` only, the encoder frozen and run in every step (one epoch: nothing to reuse)."""
    return {
        **base, **PRETRAIN, "model_name_or_path": start, "train_file": train_file, "do_eval": False,
        "do_predict": False, "validation_file": None, "test_file": None, "cache_encoder_states": False,
        "output_dir": output_dir,
    }  # fmt: skip


def training_run(args, family: str, setting: dict, source_length: int | None, what: str,
                 training: dict | None = None) -> dict:  # fmt: skip
    """The headline run of `family` with a lever `setting` (its pretraining stage first, when it has one): trained
    on the training split, scored on the validation split with greedy decoding; `training`: a row's settings of the
    headline stages (SummarizationRow.training). Its result, with the seconds of training (the stage's included)
    and the commands."""
    base = recipe(args)
    start = start_folder(args, family, setting["cross_attention_init"], args.converted)
    script = {key: value for key, value in setting.items() if key not in LEVER_BASE and key != "continue"}
    length = {} if source_length is None else {"max_source_length": source_length}
    name = setting_name({key: value for key, value in setting.items() if key != "continue"})
    name += f"-source{source_length}" if source_length else ""
    name += "".join(f"-{value}" for value in (training or {}).values())
    folder = args.folder / "tuning" / family
    commands, seconds = [], 0.0
    if setting["pretrain"]:  # the recipe's settings from the start: the later levers' runs share the stage
        output = folder / "pretrain" / f"{setting['cross_attention_init']}-{setting['pretrain']}"
        stage = pretraining(base, start, pseudo_summaries(args, setting["pretrain"]), str(output))
        pretrained = run_script(args, stage, f"{family}: pretraining {setting['pretrain']}")
        commands.append(pretrained["command"])
        seconds += pretrained["metrics"]["train_runtime"]
        start = relative(stage["output_dir"])
    settings = {
        **base, **script, **length, **(training or {}), "model_name_or_path": start, "do_predict": False,
        "test_file": None, **LEVER_DECODING, "output_dir": str(folder / name),
    }  # fmt: skip
    found = run_script(args, settings, f"{family}: {what}")
    then = setting.get("continue")
    if then:  # a second stage from the run's model
        commands.append(found["command"])
        seconds += found["metrics"]["train_runtime"]
        settings = {
            **settings, **then, "model_name_or_path": relative(settings["output_dir"]),
            "output_dir": f"{settings['output_dir']}-then-{setting_name(then)}",
        }  # fmt: skip
        if then.get("train_encoder_layers"):  # the states of layers in training cannot be cached
            settings["cache_encoder_states"] = False
        found = run_script(args, settings, f"{family}: {what}, then {setting_name(then)}")
    return {**found, "commands": [*commands, found["command"]], "start": settings["model_name_or_path"],
            "train_seconds": seconds + found["metrics"]["train_runtime"], "output_dir": settings["output_dir"]}


def token_spread(args, model: str) -> float:
    """How much the encoder's last-layer states differ across the first 50 positions of 32 validation articles
    (source 256): the mean over features of their standard deviation across positions, as encoder_collapse.py
    measures it (0 = every token alike)."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    encoder = AutoModelForSeq2SeqLM.from_pretrained(model).get_encoder().eval()
    rows = read_jsonl(args.data / "validation.jsonl")[:32]
    length = min(256, encoder.config.max_position_embeddings)
    inputs = tokenizer([row["document"] for row in rows], max_length=length, truncation=True, padding=True,
                       return_tensors="pt", return_token_type_ids=False)  # fmt: skip
    with torch.no_grad():
        states = encoder(**inputs).last_hidden_state
    return states[:, :50].std(dim=1).mean().item()


def length_window(args, model: str) -> tuple[int, int]:
    """The 5th and 95th percentile of the training headlines' lengths in `model`'s tokens (end of sequence
    included)."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    summaries = [row["summary"] for row in read_jsonl(args.data / "train.jsonl")]
    lengths = [len(ids) + 1 for ids in tokenizer(summaries, add_special_tokens=False)["input_ids"]]
    low, high = np.percentile(lengths, [5, 95])
    return int(low), int(np.ceil(high))


def decoding_flags(args, setting: dict, model: str) -> dict:
    """The script flags of a DECODING setting."""
    flags = {key: value for key, value in setting.items() if key != "length_window"}
    if setting.get("length_window"):
        low, high = length_window(args, model)
        flags |= {"min_target_length": low, "generation_max_length": high + 1}  # + the decoder's start token
    return flags


def decoding_run(args, model: str, setting: dict, output_dir: Path, what: str, test: bool = False) -> dict:
    """`model` (a trained run's folder) scored on the validation split, and with `test` the test split predicted,
    with a DECODING setting."""
    settings = {
        **recipe(args), **decoding_flags(args, setting, model), "model_name_or_path": relative(model),
        "do_train": False, "do_predict": test, "output_dir": str(output_dir),
    }  # fmt: skip
    if not test:
        settings["test_file"] = None
    return run_script(args, settings, what)


def decoding_name(setting: dict) -> str:
    return "-".join(f"{key}{value}" for key, value in setting.items())


def tune(args, family: str) -> dict:
    """Steps 1 and 2 for `family`: the levers in turn, then the decodings, on the validation split."""
    best = dict(LEVER_BASE)
    found = training_run(args, family, best, None, "levers: the recipe")
    levers = [{"lever": "recipe", "settings": dict(best), "rouge1": found["metrics"]["eval_rouge1"], "kept": True,
               "train_seconds": found["train_seconds"]}]  # fmt: skip
    best_run = found
    for lever in LEVERS:
        setting = {**best, **lever.settings}
        found = training_run(args, family, setting, None, f"levers: {lever.name}")
        kept = found["metrics"]["eval_rouge1"] > best_run["metrics"]["eval_rouge1"]
        record = {"lever": lever.name, "settings": setting, "rouge1": found["metrics"]["eval_rouge1"],
                  "train_seconds": found["train_seconds"]}  # fmt: skip
        if (setting.get("continue") or {}).get("train_encoder_layers"):  # kept only while the states stay apart
            record["spread"] = [token_spread(args, model) for model in (found["start"], found["output_dir"])]
            kept = kept and record["spread"][1] >= SPREAD_KEPT * record["spread"][0]
        levers.append({**record, "kept": kept})
        if kept:
            best, best_run = setting, found
    decoding = []
    for setting in DECODING:
        if setting == LEVER_DECODING:  # the best run's own validation score
            decoding.append({"setting": setting, "rouge1": best_run["metrics"]["eval_rouge1"]})
            continue
        name = decoding_name(setting)
        output = args.folder / "tuning" / family / "decoding" / name
        scored = decoding_run(args, best_run["output_dir"], setting, output, f"{family}: decoding {name}")
        decoding.append({"setting": setting, "rouge1": scored["metrics"]["eval_rouge1"]})
    chosen_decoding = max(decoding, key=lambda run: run["rouge1"])["setting"]
    return {"levers": levers, "decoding": decoding, "chosen": {"training": best, "decoding": chosen_decoding}}


def stored_tuning(args, row: str, results: dict) -> dict | None:
    """The tuning of the row's family that `results` records for another row of it, if it is what the tuning would
    run now: the levers and decodings are specs.LEVERS and DECODING, and the recipe is the one it ran under.
    Otherwise None."""
    family = family_of(row)
    names = ["recipe", *(lever.name for lever in LEVERS)]
    for name, stored in results.items():
        if name == row or name not in ROWS or family_of(name) != family or "tuning" not in stored:
            continue
        tuning = stored["tuning"]
        same = [lever["lever"] for lever in tuning["levers"]] == names and \
            [run["setting"] for run in tuning["decoding"]] == DECODING and stored.get("recipe") == recipe(args)
        if same:
            return tuning
    return None


def train(args, row: str, results: dict) -> dict:
    """The row's family tuning (a family's is run once: recorded for another of its rows, it is read back), its
    training run with the chosen settings at its source length, and its test predictions with the chosen
    decoding."""
    family = family_of(row)
    tuning = stored_tuning(args, row, results) or tune(args, family)
    length = ROWS[row].settings.get("max_source_length")
    if length == recipe(args)["max_source_length"]:
        length = None
    trained = training_run(args, family, tuning["chosen"]["training"], length, ROWS[row].label, ROWS[row].training)
    decoding = tuning["chosen"]["decoding"]
    output = Path(trained["output_dir"]) / "test"
    predicted = decoding_run(args, trained["output_dir"], {**decoding, **(ROWS[row].settings or {})}, output,
                             f"{ROWS[row].label}: test", test=True)  # fmt: skip
    predictions = predicted["predictions"]
    references = [found["summary"] for found in read_jsonl(args.data / "test.jsonl")]
    if predictions is None or len(predictions) != len(references):
        sys.exit(f"summarization.py: error: {output} has no prediction for every test article")
    return {
        "tuning": tuning,
        "chosen": tuning["chosen"],
        "recipe": recipe(args),
        "commands": [*trained["commands"], predicted["command"]],
        "test": rouge(predictions, references),
        "validation_rouge1": predicted["metrics"]["eval_rouge1"],
        "train_seconds": trained["train_seconds"],
        # prediction time per test article: the encoder's pass, generation with the chosen decoding, the loss
        "decode_ms": 1000 * predicted["metrics"]["test_runtime"] / len(predictions),
        "threads": args.threads,
        "predictions": predictions,
    }


def main():
    args = parse_args()
    args.folder.mkdir(parents=True, exist_ok=True)
    results_file = args.folder / "results.json"
    for row in args.rows:
        results = summarization_results(args.runs, args.results.parent)  # here or as docs/ records it
        found = {"label": ROWS[row].label, **(lead(args) if row == "lead" else train(args, row, results))}
        # another runner may have finished rows meanwhile: write this row into the file as it is now
        write_json(results_file, {**read_json(results_file, {}), row: found})
        print(f"{ROWS[row].label}: test {found['test']}", flush=True)
    write_report(args.runs, args.results, headlines_data=args.data)


if __name__ == "__main__":
    main()
