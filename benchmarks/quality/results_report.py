"""docs/RESULTS.md from the stored runs of benchmarks/quality/run.py: per table mean +- std over seeds, parameters,
training time, learning-curve plots. A "## Reading" section already in the file (written by a person, after
looking at the numbers) is kept as it is.

    python benchmarks/quality/results_report.py        # rewrite docs/RESULTS.md from runs/quality
"""

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only
import matplotlib.pyplot as plt  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
READING = "## Reading"
TITLES = {
    "classification": "Classification: Fastformer vs a Transformer of the same size",
    "interaction": "RQ2: the interaction function",
    "sharing": "RQ3: parameter sharing",
    "summarization": "Summarization: Fastformer encoder-decoder vs a Transformer (BART) of the same size",
}
CLASSIFICATION = [("accuracy", "eval_accuracy", 100), ("macro-F1", "eval_f1_macro", 100)]
SUMMARIZATION = [("ROUGE-1", "eval_rouge1", 1), ("ROUGE-2", "eval_rouge2", 1), ("ROUGE-L", "eval_rougeL", 1),
                 ("generated length", "eval_gen_len", 1)]  # fmt: skip


def load_results(runs: Path, tags: dict[str, str]) -> dict[str, dict[tuple[str, str, str], list[dict]]]:
    """Per table, its stored runs (those on the table's data tag) by `key`, in seed order."""
    grouped = {}
    for path in sorted(runs.glob("*/*/seed*/quality_result.json")):
        result = json.loads(path.read_text())
        stored_as = (result["model_type"], result["overrides"], result.get("extra", ""))
        grouped.setdefault(result["data"], {}).setdefault(stored_as, []).append(result)
    return {
        table: {found_key: sorted(found, key=lambda r: r["seed"]) for found_key, found in grouped.get(tag, {}).items()}
        for table, tag in tags.items()
    }


def key(row) -> tuple[str, str, str]:
    """A table row (label, model type, overrides[, extra flags]) -> the key its runs are stored under."""
    _, model_type, overrides, *extra = row
    return model_type, overrides, " ".join(extra[0]) if extra else ""


def mean_std(values, digits=2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} +- {statistics.stdev(values):.{digits}f}"


def table(name, rows, results) -> list[str]:
    columns = SUMMARIZATION if name == "summarization" else CLASSIFICATION
    lines = [
        "| model | " + " | ".join(title for title, _, _ in columns) + " | parameters | training s per run | seeds |",
        "|---" * (len(columns) + 4) + "|",
    ]
    for row in rows:
        label, runs = row[0], results.get(key(row))
        if not runs:
            lines.append(f"| {label} | " + " | ".join("not run" for _ in columns) + " | | | 0 |")
            continue
        cells = [mean_std([run["metrics"][metric] * scale for run in runs]) for _, metric, scale in columns]
        seconds = mean_std([run["train_seconds"] for run in runs], digits=0)
        lines.append(
            f"| {label} | " + " | ".join(cells) + f" | {runs[0]['parameters'] / 1e6:.2f}M | {seconds} | {len(runs)} |"
        )
    return lines


def plot_curves(name, rows, results, folder: Path) -> str | None:
    """The evaluation metric after each epoch, mean over seeds, one line per model; the file name, or None."""
    title, metric, scale = (SUMMARIZATION if name == "summarization" else CLASSIFICATION)[0]
    figure, axis = plt.subplots(figsize=(6, 4))
    plotted = False
    for row in rows:
        label, runs = row[0], results.get(key(row))
        if not runs:
            continue
        curves = [
            [(entry["epoch"], entry[metric] * scale) for entry in run["curve"] if metric in entry] for run in runs
        ]
        epochs = [epoch for epoch, _ in curves[0]]
        means = [statistics.fmean(curve[i][1] for curve in curves) for i in range(len(epochs))]
        axis.plot(epochs, means, marker="o", label=label)
        plotted = True
    if not plotted:
        plt.close(figure)
        return None
    axis.set(xlabel="epoch", ylabel=title, title=TITLES[name].split(":")[0] + f": {title} (mean over seeds)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    filename = f"results_{name}.png"
    figure.savefig(folder / filename, dpi=110)
    plt.close(figure)
    return filename


def commands(results, rows) -> list[str]:
    """The script command of each model's first seed, as it ran (the output folder and seed vary)."""
    found = [results[key(row)][0] for row in rows if key(row) in results]
    return [f"    {run['command'].replace(str(REPO) + '/', '')}" for run in found]


def write_report(runs: Path, destination: Path, tables: dict):
    record = runs / "tables.json"
    tags = json.loads(record.read_text()) if record.exists() else {}
    by_table = load_results(runs, tags)
    raw = destination.parent / "results_runs.json"  # every run's numbers, curve and command, for the record
    unique = {id(run): run for found in by_table.values() for runs_ in found.values() for run in runs_}
    raw.write_text(json.dumps(sorted(unique.values(), key=lambda r: (r["data"], r["command"])), indent=1) + "\n")
    lines = [
        "# The paper's findings at small scale, on real data",
        "",
        "Generated by `benchmarks/quality/run.py` (one command per table, below) from the runs in `runs/quality`;",
        "`python benchmarks/quality/results_report.py` regenerates this file. Everything trained from scratch on",
        "this machine's 2 CPU cores (Intel Xeon, 2 threads, 24 GB, no GPU), torch 2.13 CPU, transformers 5.24.",
        "Mean +- standard deviation over the seeds; training s is the Trainer's train_runtime (evaluation",
        "after every epoch included). Every run's numbers, learning curve and command: results_runs.json.",
        "",
        "Settings, the paper's scaled to what 2 CPU cores finish: classification on 20 Newsgroups (11,293 training /",
        "7,528 test documents in ../shared/data; each table states the random subset it used), max length 512,",
        "hidden 128 (paper: 256), 8 heads of 16 (paper: 16 of 16), feed-forward 512, 2 layers, dropout 0.2, AdamW",
        "lr 1e-3 (paper: Adam 1e-3), batch 32 (paper: 64), 3 epochs, 20 warm-up steps. Fastformer is the paper's",
        "final model unless the row says otherwise (product interaction, query-value and layer-wise sharing,",
        "additive pooling); the Transformer is transformers' BERT with SDPA attention, same width, depth, heads",
        "and hidden dropout, no dropout on its attention weights (with it, CPU SDPA falls back to an unfused kernel",
        "that is 5x slower). Summarization on news_headlines (2,924 training / 365 validation articles),",
        "article -> headline, source 256 / target 32 tokens, hidden 128, 8 heads, 2 encoder + 2",
        "decoder layers, no layer sharing, dropout 0.1, lr 5e-4, batch 16, 5 epochs, greedy decoding; BART has the",
        "same sizes (d_model 128, 8 heads, feed-forward 512, 2 + 2 layers, dropout 0.1).",
        "",
    ]
    for name, rows in tables.items():
        results = by_table.get(name, {})
        if not any(key(row) in results for row in rows):
            continue
        source, train, evaluation = tags[name].rsplit("-", 2)
        lines += [
            f"## {TITLES[name]}",
            "",
            f"Data: {int(train):,} training and {int(evaluation):,} evaluation examples of {source}, drawn at random.",
            "",
            *table(name, rows, results),
            "",
        ]
        picture = plot_curves(name, rows, results, destination.parent)
        if picture:
            lines += [f"![learning curves]({picture})", ""]
        data = "news_headlines" if name == "summarization" else "20newsgroups"
        lines += [
            "Command:",
            "",
            f"    python benchmarks/quality/run.py {name} --data ../shared/data/{data}",
            "",
            "which ran, per model (first seed):",
            "",
            *commands(results, rows),
            "",
        ]
    if destination.exists() and READING in destination.read_text():
        text = destination.read_text()
        lines.append(text[text.index(READING) :].rstrip("\n"))
    destination.write_text("\n".join(lines) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality")
    parser.add_argument("--results", type=Path, default=REPO / "docs" / "RESULTS.md")
    args = parser.parse_args()
    from run import TABLES

    write_report(args.runs, args.results, TABLES)


if __name__ == "__main__":
    main()
