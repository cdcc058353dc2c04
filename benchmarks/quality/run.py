"""The paper's classification findings at small scale on real data: one command per table of specs.TABLES, then
docs/RESULTS.md regenerated (report.py, which also says how the tables were run).

Each model trains from scratch with scripts/run_classification.py (the Transformer under the paper's pooling through
baselines.py), tuned the same way: each setting of specs.GRID with the first seed, scored on a validation split drawn
from the training documents; then the best setting with the other seeds. A run already in --runs with the same
command is read back, not repeated: an interrupted table continues, and a model two tables share trains once.

    python -m benchmarks.quality.run classification --data ../shared/data/20newsgroups
    python -m benchmarks.quality.run interaction    --data ../shared/data/20newsgroups
    python -m benchmarks.quality.run sharing        --data ../shared/data/20newsgroups

--data holds train.jsonl and test.jsonl (text, label); the subsets are drawn at random (seed 0; sizes: the table's
samples or the arguments), so a class-sorted file is fine.
"""

import argparse
import math
import random
import sys
from pathlib import Path

from safetensors import safe_open

from benchmarks.harness import DOCS, REPO, SCRIPTS, arguments, flags, read_json, run_stored, write_json
from benchmarks.quality.report import TABLES_FILE, best, write_report
from benchmarks.quality.specs import BASELINES, FASTFORMER, GRID, SEEDS, TABLES, TRAINING, Setting


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("table", choices=list(TABLES))
    parser.add_argument("--data", type=Path, required=True, help="folder with the data set's JSON-lines files")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    for split in ("train", "validation", "test"):
        parser.add_argument(f"--{split}-samples", type=int, default=None, help="default: the table's")
    parser.add_argument("--grid", nargs="+", default=None, metavar="LR,WARMUP", help="default: specs.GRID")
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality", help="run folders and results")
    parser.add_argument("--results", type=Path, default=DOCS / "RESULTS.md")
    parser.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more script flags (e.g. for a test)")
    args = parser.parse_args(argv)
    given = (args.train_samples, args.validation_samples, args.test_samples)
    args.samples = [value or default for value, default in zip(given, TABLES[args.table].samples)]
    args.grid = [Setting(*setting.split(",")) for setting in args.grid] if args.grid else GRID
    args.tag = "-".join([args.data.name, *map(str, args.samples)])  # the runs' data: source and sizes
    return args


def draw(source: Path, sizes: list[int], seed: int = 0) -> list[list[str]]:
    """Disjoint random subsets of the lines of `source`, of the given sizes (fewer if it runs out)."""
    lines = source.read_text().splitlines()
    random.Random(seed).shuffle(lines)
    starts = [sum(sizes[:index]) for index in range(len(sizes))]
    return [lines[start : start + size] for start, size in zip(starts, sizes)]


def prepare_data(args) -> dict[str, Path]:
    folder = args.runs / "data" / args.tag
    for name in ("train.jsonl", "test.jsonl"):
        if not (args.data / name).exists():
            sys.exit(f"run.py: error: {args.data / name} not found (--data must hold train.jsonl and test.jsonl)")
    train, validation = draw(args.data / "train.jsonl", args.samples[:2])
    (test,) = draw(args.data / "test.jsonl", args.samples[2:])
    folder.mkdir(parents=True, exist_ok=True)
    files = {split: folder / f"{split}.jsonl" for split in ("train", "validation", "test")}
    for path, lines in zip(files.values(), (train, validation, test)):
        path.write_text("\n".join(lines) + "\n")
    return files


def run_name(model) -> str:
    """One folder per distinct model and flags: the same ones share their runs across tables."""
    short = model.overrides.replace(FASTFORMER, "").strip(",")
    name = f"{model.model_type}-{short.replace('=', '_').replace(',', '-') or 'default'}"
    return name + "".join(f"-{flag.strip('-')}_{value}" for flag, value in zip(model.extra[::2], model.extra[1::2]))


def train(args, data, model, seed, setting) -> dict:
    """One run (or its stored result): validation and test metrics, parameters, training time, the curve."""
    run = f"lr{setting.learning_rate}-warmup{setting.warmup_steps}-seed{seed}"
    folder = args.runs / args.tag / run_name(model) / run
    baseline = model.model_type in BASELINES
    script = ["-m", "benchmarks.quality.baselines"] if baseline else [str(SCRIPTS / "run_classification.py")]
    command = [
        sys.executable, *script, "--output_dir", str(folder), "--do_train", "--do_eval", "--do_predict",
        "--train_file", str(data["train"]), "--validation_file", str(data["validation"]),
        "--test_file", str(data["test"]), "--model_type", model.model_type, "--config_overrides", model.overrides,
        "--seed", str(seed), "--eval_strategy", "epoch", "--save_strategy", "no", "--report_to", "none",
        "--disable_tqdm", "true", *flags(TRAINING), *flags(setting._asdict()), *model.extra, *args.extra,
    ]  # fmt: skip

    def result(folder, seconds) -> dict:
        metrics = read_json(folder / "all_results.json")
        with safe_open(folder / "model.safetensors", "pt") as weights:  # tied weights are stored once
            parameters = sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())
        curve = [entry for entry in read_json(folder / "trainer_state.json")["log_history"]
                 if any(key.startswith("eval_") for key in entry)]  # fmt: skip
        return {"data": args.tag, "model_type": model.model_type, "overrides": model.overrides,
                "extra": " ".join(model.extra), **setting._asdict(), "seed": seed, "metrics": metrics,
                "parameters": parameters, "train_seconds": metrics["train_runtime"], "wall_seconds": seconds,
                "curve": curve}  # fmt: skip

    what = f"{model.label}, lr {setting.learning_rate}, warm-up {setting.warmup_steps}, seed {seed}"
    return run_stored(command, folder, result, what, env={"HF_HUB_OFFLINE": "1"}, in_process=args.in_process)


def tuned(args, data, model) -> None:
    """The grid with the first seed, then the best setting by validation accuracy with the other seeds."""
    first, *others = args.seeds
    grid = [train(args, data, model, first, setting) for setting in args.grid]
    chosen = best(grid)[1][0]  # the report's choice, so the table shows the setting that got the seeds
    for seed in others:
        train(args, data, model, seed, Setting(chosen["learning_rate"], chosen["warmup_steps"]))


def main():
    args = parse_args()
    data = prepare_data(args)
    for model in TABLES[args.table].rows:
        tuned(args, data, model)
    record = args.runs / TABLES_FILE
    write_json(record, {**read_json(record, {}), args.table: args.tag}, indent=2)
    write_report(args.runs, args.results)


if __name__ == "__main__":
    main()
