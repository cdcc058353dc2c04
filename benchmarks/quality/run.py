"""The paper's classification findings at small scale (docs/RESULTS.md): each model of a table trains from scratch
with scripts/run_classification.py at each setting of GRID (first seed, scored on validation documents), then the
best setting with the other seeds. Runs are stored under --runs and read back while their command is the same.

    python -m benchmarks.quality.run classification --data ../shared/data/20newsgroups   # also interaction, sharing
"""

import math
import os
import random
import sys
from pathlib import Path

from safetensors import safe_open

from benchmarks import harness
from benchmarks.harness import DOCS, REPO, SCRIPTS, arguments, flags, mean_std, read_json, table

# the paper's setting (hidden 256, 16 heads, 2 layers, batch 64) on 2 CPU cores: half the width, heads of size 16
FASTFORMER = "hidden_size=128,num_attention_heads=8,intermediate_size=512,num_hidden_layers=2,hidden_dropout_prob=0.2"
# no dropout on BERT's attention weights: with it CPU SDPA falls back to its unfused kernel, 5x slower a step here
BERT = FASTFORMER + ",attention_probs_dropout_prob=0.0"
QUERY_VALUE = FASTFORMER + ",share_query_value=true,share_layers=false"
TRAINING = {"max_seq_length": 512, "num_train_epochs": 3, "per_device_train_batch_size": 32}
# (learning rate, warm-up steps): the paper's rate and a third of it; a short warm-up, and about an epoch (94 steps)
GRID = [("1e-3", "20"), ("1e-3", "100"), ("3e-4", "20"), ("3e-4", "100")]
# each table's rows: (label, model type, --config_overrides); bert_additive_pooling is baselines.py's
TABLES = {
    "classification": [
        ("Fastformer", "fastformer", FASTFORMER),
        ("Transformer (BERT, SDPA), additive pooling", "bert_additive_pooling", BERT),
        # the pooling of transformers' BertForSequenceClassification ([CLS]), in both attentions
        ("Fastformer, [CLS] pooling", "fastformer", FASTFORMER + ",pooler_type=cls"),
        ("Transformer (BERT, SDPA), [CLS] pooling", "bert", BERT),
    ],
    "interaction": [
        ("product", "fastformer", FASTFORMER),
        ("add", "fastformer", FASTFORMER + ",interaction=add"),
        ("concat", "fastformer", FASTFORMER + ",interaction=concat"),
    ],
    "sharing": [
        ("none", "fastformer", FASTFORMER + ",share_query_value=false,share_layers=false"),
        ("query-value", "fastformer", QUERY_VALUE),
        ("query-value + head-wise", "fastformer", QUERY_VALUE + ",share_heads=true"),
        ("query-value + layer-wise", "fastformer", FASTFORMER),
    ],
}
# (training, validation, test) documents drawn for each table
SAMPLES = {"classification": (3000, 600, 2000), "interaction": (1500, 600, 1000), "sharing": (1500, 600, 1000)}


def parse_args(argv=None):
    parser = arguments(__doc__, threads=None)
    parser.add_argument("table", choices=list(TABLES))
    parser.add_argument("--data", type=Path, required=True, help="a folder with train.jsonl and test.jsonl")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--samples", type=int, nargs=3, default=None, metavar=("TRAIN", "VALIDATION", "TEST"))
    parser.add_argument("--grid", nargs="+", default=None, metavar="LR,WARMUP", help="default: GRID")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the record goes")
    args = parser.parse_args(argv)
    args.samples = args.samples or SAMPLES[args.table]
    args.grid = [tuple(setting.split(",")) for setting in args.grid] if args.grid else GRID
    args.tag = "-".join([args.data.name, *map(str, args.samples)])  # the runs' data: source and sizes
    return args


def prepare_data(args) -> dict[str, Path]:
    """Random subsets (seed 0) of train.jsonl (training, then validation) and test.jsonl, written under --runs."""
    lines = {}
    for source in ("train", "test"):
        if not (args.data / f"{source}.jsonl").exists():
            sys.exit(f"run.py: error: {args.data / source}.jsonl not found")
        lines[source] = (args.data / f"{source}.jsonl").read_text().splitlines()
        random.Random(0).shuffle(lines[source])
    train, validation, test = args.samples
    splits = {"train": lines["train"][:train], "validation": lines["train"][train:][:validation]}
    folder = args.runs / "data" / args.tag
    folder.mkdir(parents=True, exist_ok=True)
    for name, chosen in {**splits, "test": lines["test"][:test]}.items():
        (folder / f"{name}.jsonl").write_text("\n".join(chosen) + "\n")
    return {f"{name}_file": folder / f"{name}.jsonl" for name in ("train", "validation", "test")}


def outputs(folder: Path) -> dict:
    """A run's metrics, parameters (tied weights counted once) and validation curve."""
    with safe_open(folder / "model.safetensors", "pt") as weights:
        parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
    log = read_json(folder / "trainer_state.json")["log_history"]
    curve = [entry for entry in log if any(key.startswith("eval_") for key in entry)]
    return {**read_json(folder / "all_results.json"), "parameters": parameters, "curve": curve}


def train(args, data: dict, model: tuple[str, str, str], seed: int, setting: tuple[str, str]) -> dict:
    """One run of a table's `model`, or its stored result."""
    label, model_type, overrides = model
    tuned = {"learning_rate": setting[0], "warmup_steps": setting[1]}
    # one folder per model and flags: the same ones share their runs across tables
    short = overrides.replace(FASTFORMER, "").strip(",").replace("=", "_").replace(",", "-")
    run = f"lr{setting[0]}-warmup{setting[1]}-seed{seed}"
    folder = args.runs / args.tag / f"{model_type}-{short or 'default'}" / run
    baseline = model_type == "bert_additive_pooling"
    script = ["-m", "benchmarks.quality.baselines"] if baseline else [str(SCRIPTS / "run_classification.py")]
    stages = {"do_train": True, "do_eval": True, "do_predict": True, "eval_strategy": "epoch", "save_strategy": "no"}
    settings = {"model_type": model_type, "config_overrides": overrides, "seed": seed, "disable_tqdm": True, **TRAINING}
    command = [sys.executable, *script, *flags({"output_dir": folder, **stages, **data, **settings, **tuned})]
    command += ["--report_to", "none"]
    # the baseline imports scripts.run_classification, whose neighbours (training_utils) need scripts/ on the path
    path = os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")]))
    env = {"PYTHONPATH": path} if baseline else None
    return {"model": label, **tuned, "seed": seed, **harness.run_script(command, folder, outputs, env)}


def main(argv=None):
    args = parse_args(argv)
    data = prepare_data(args)
    rows, cells = [], []
    first, *others = args.seeds
    for model in TABLES[args.table]:
        grid = [train(args, data, model, first, setting) for setting in args.grid]
        chosen = max(grid, key=lambda run: run["eval_accuracy"])
        seeds = [train(args, data, model, seed, (chosen["learning_rate"], chosen["warmup_steps"])) for seed in others]
        rows += grid + seeds
        runs = [chosen, *seeds]
        row = [mean_std([100 * run[f"test_{metric}"] for run in runs]) for metric in ("accuracy", "f1_macro")]
        setting = f"lr {chosen['learning_rate']}, warm-up {chosen['warmup_steps']}"
        row += [setting, f"{chosen['parameters'] / 1e6:.2f}M", mean_std([run["train_runtime"] for run in runs], 0)]
        cells.append([model[0], *row, len(runs), *(f"{100 * run['eval_accuracy']:.2f}" for run in grid)])
    settings = {name: getattr(args, name) for name in ("table", "samples", "grid", "seeds")}
    harness.write_record(args.docs / f"results_{args.table}.json", rows, settings)
    header = ["model", "test accuracy", "test macro-F1", "chosen on validation", "parameters", "training s per run"]
    print(table([*header, "seeds", *(f"validation, lr {lr}, warm-up {warmup}" for lr, warmup in args.grid)], cells))


if __name__ == "__main__":
    main()
