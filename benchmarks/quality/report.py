"""docs/RESULTS.md from the stored runs of `python -m benchmarks.quality.run` and `.summarization`: per table
mean +- std over seeds, parameters, training time, learning-curve plots. The runs come from the report's own record
of them (docs/results_runs.json, docs/results_summarization.json), where those stored in runs/quality take the place
of the recorded ones of their table row. What a person wrote below the marker line (the reading) is kept.

    python -m benchmarks.quality.report        # rewrite docs/RESULTS.md from docs/ and runs/quality
"""

import re
import statistics
import textwrap
from pathlib import Path

from benchmarks.harness import (
    DOCS,
    MEAN_STD,
    REPO,
    arguments,
    mean_std,
    plt,
    read_json,
    read_jsonl,
    save_figure,
    table,
    write_doc,
    write_json,
)
from benchmarks.quality.specs import (
    DATA,
    DATA_SIZES,
    DECODING,
    GRID,
    LEVERS,
    PAPER,
    PRETRAIN,
    ROWS,
    SEEDS,
    SIZE,
    SPREAD_KEPT,
    TABLES,
    TRAINING,
)

CLASSIFICATION = [("accuracy", "accuracy", 100), ("macro-F1", "f1_macro", 100)]  # test_* and eval_* metrics
TABLES_FILE = "tables.json"  # in runs/quality: which data (tag) each table was last run on, for the report
RESULT = "benchmark_result.json"  # a classification run's stored result, in its folder
HEADLINES = REPO / "data" / "news_headlines"
NUMBERS = ("no", "one", "two", "three", "four", "five")


def run_group(run: dict) -> tuple[str, str, str, str]:
    """The data and the table row (model type, overrides, extra flags) a stored classification run belongs to."""
    return run["data"], run["model_type"], run["overrides"], run["extra"]


def stored_runs(runs: Path, record: Path) -> tuple[dict[str, str], list[dict]]:
    """Each table's data tag and every stored run: what `record` (the report's record, docs/results_runs.json)
    holds, where the runs stored in `runs` take the place of the recorded ones of their row and data (run.py runs a
    row's grid and seeds together), so that a fresh clone regenerates the report without losing what was measured."""
    recorded = read_json(record, {"tables": {}, "runs": []})
    tags = {**recorded["tables"], **read_json(runs / TABLES_FILE, {})}
    local = [read_json(path) for path in runs.glob(f"*/*/*/{RESULT}")]
    replaced = {run_group(run) for run in local}
    kept = [run for run in recorded["runs"] if run_group(run) not in replaced]
    return tags, sorted(kept + local, key=lambda run: (run["data"], run["command"]))


def load_results(stored: list[dict], tags: dict[str, str]) -> dict[str, dict[tuple[str, str, str], list[dict]]]:
    """Per table, its stored runs (those on the table's data tag) by `key`, in seed order."""
    grouped = {}
    for result in stored:
        data, *stored_as = run_group(result)
        grouped.setdefault(data, {}).setdefault(tuple(stored_as), []).append(result)
    return {
        table: {found_key: sorted(found, key=lambda r: r["seed"]) for found_key, found in grouped.get(tag, {}).items()}
        for table, tag in tags.items()
    }


def setting(run) -> str:
    return f"lr {run['learning_rate']}, warm-up {run['warmup_steps']}"


def grid(runs) -> dict[str, dict]:
    """The first seed's run of each tuning setting."""
    first = min(run["seed"] for run in runs)
    return {setting(run): run for run in runs if run["seed"] == first}


def best(runs) -> tuple[str, list[dict]]:
    """The setting with the best validation accuracy (first seed), and its runs over all seeds."""
    tried = grid(runs)
    chosen = max(tried, key=lambda name: tried[name]["metrics"]["eval_accuracy"])
    return chosen, [run for run in runs if setting(run) == chosen]


def classification_table(rows, results) -> list[str]:
    cells = []
    for row in rows:
        runs = results.get(row.key)
        if not runs:
            cells.append([row.label, *("not run" for _ in CLASSIFICATION), "", "", "", 0])
            continue
        chosen, runs = best(runs)
        scores = [mean_std([run["metrics"][f"test_{metric}"] * scale for run in runs]) for _, metric, scale in
                  CLASSIFICATION]  # fmt: skip
        seconds = mean_std([run["train_seconds"] for run in runs], digits=0)
        cells.append([row.label, *scores, chosen, f"{runs[0]['parameters'] / 1e6:.2f}M", seconds, len(runs)])
    header = ["model", *(f"test {title}" for title, _, _ in CLASSIFICATION), "chosen on validation", "parameters",
              "training s per run", "seeds"]  # fmt: skip
    tried = {row.label: grid(results[row.key]) for row in rows if results.get(row.key)}
    settings = list(dict.fromkeys(name for found in tried.values() for name in found))
    accuracies = [[label, *(f"{100 * found[name]['metrics']['eval_accuracy']:.2f}" if name in found else ""
                            for name in settings)] for label, found in tried.items()]  # fmt: skip
    return [*table(header, cells), "", "Tuning grid: validation accuracy (first seed) of each setting.", "",
            *table(["model", *settings], accuracies)]  # fmt: skip


def plot_curves(spec, results, folder: Path) -> str:
    """Validation accuracy after each epoch for the chosen setting, mean over seeds, one line per model that ran;
    the file name."""
    title, metric, scale = CLASSIFICATION[0]
    figure, axis = plt.subplots(figsize=(6, 4))
    for row in (row for row in spec.rows if results.get(row.key)):
        _, runs = best(results[row.key])
        curves = [
            [(entry["epoch"], entry[f"eval_{metric}"] * scale) for entry in run["curve"] if f"eval_{metric}" in entry]
            for run in runs
        ]
        epochs = [epoch for epoch, _ in curves[0]]
        means = [statistics.fmean(curve[i][1] for curve in curves) for i in range(len(epochs))]
        axis.plot(epochs, means, marker="o", label=row.label)
    axis.set(xlabel="epoch", ylabel=f"validation {title}", title=spec.title.split(":")[0] + " (mean over seeds)")
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    save_figure(figure, folder / f"results_{spec.name}.png", dpi=110)
    return f"results_{spec.name}.png"


def commands(results, rows) -> list[str]:
    """The script command of each model's chosen setting, first seed, as it ran (the output folder and seed vary)."""
    found = [best(results[row.key])[1][0] for row in rows if row.key in results]
    return [f"    {run['command']}" for run in found]


SUMMARIZATION_COLUMNS = [("ROUGE-1", "rouge1"), ("ROUGE-2", "rouge2"), ("ROUGE-L", "rougeL"),
                         ("ROUGE-Lsum", "rougeLsum")]  # fmt: skip
EXAMPLES = 5  # test articles shown with their reference and generated headlines


def lever_text(settings: dict) -> str:
    """A cumulative lever setting in words."""
    parts = [f"cross-attention {settings['cross_attention_init'].replace('_', '-')}"]
    if settings.get("pretrain"):
        parts.append(f"{settings['pretrain']} pseudo-summary pretraining")
    if "label_smoothing_factor" in settings:
        parts.append(f"label smoothing {settings['label_smoothing_factor']:g}")
    then = settings.get("continue")
    if then:
        layers = then.get("train_encoder_layers")
        parts.append(f"then {then['num_train_epochs']} epoch at lr {then['learning_rate']:g}"
                     + (f", encoder's top {layers} layers trained" if layers else ", encoder frozen"))  # fmt: skip
    return ", ".join(parts)


def decoding_text(setting: dict) -> str:
    beams = setting["num_beams"]
    decoding = "greedy" if beams == 1 else f"{beams} beams, length penalty {setting['length_penalty']:g}"
    size = setting["no_repeat_ngram_size"]
    decoding += f", no repeated {size}-grams" if size else ""
    return decoding + (", length window" if setting.get("length_window") else "")


def chosen_text(row: dict) -> str:
    chosen = row["chosen"]
    if "k" in chosen:
        return f"k = {chosen['k']} words"
    return f"{lever_text(chosen['training'])}; {decoding_text(chosen['decoding'])}"


def rouge_words(text: str) -> list[str]:
    """The words ROUGE compares (rouge_score's tokenization, before stemming): runs of lowercase letters and digits,
    so a generated "russia ' s" (the uncased tokenizer's decoding) and a written "Russia's" are the same words."""
    return re.findall(r"[a-z0-9]+", text.lower())


def copied_key(headline: str) -> str:
    """What two headlines share when one copies the other: their words as ROUGE reads them."""
    return " ".join(rouge_words(headline))


def mean_words(texts: list[str]) -> float:
    return statistics.fmean(len(rouge_words(text)) for text in texts)


def summarization_section(results: dict, data: Path) -> list[str]:
    """docs/RESULTS.md's summarization section from the summarization runner's results.json."""
    test = read_jsonl(data / "test.jsonl")
    references = [row["summary"] for row in test]
    train, validation = read_jsonl(data / "train.jsonl"), read_jsonl(data / "validation.jsonl")
    training = {copied_key(row["summary"]) for row in train}
    recipe = read_json(REPO / "configs" / "summarization" / "news_headlines.json")
    lines = [
        "## Summarization: news articles -> headlines, warm-started",
        "",
        *textwrap.wrap(
            f"Data: the bundled news_headlines split, {len(test):,} test articles ({len(train):,} training, "
            f"{len(validation):,} validation; cut to 2,048 tokens). Every trained row follows the recipe "
            f"`configs/summarization/news_headlines.json` with its own model, in float32: {recipe['num_train_epochs']} "
            f"epochs of batch {recipe['per_device_train_batch_size']}, AdamW at lr {recipe['learning_rate']:g}, linear "
            "decay after 10% warm-up, target 32 tokens, the encoder frozen (its word embeddings too) and its states "
            "computed once per article, the last epoch kept. Each model family is tuned on the validation split at "
            f"source {recipe['max_source_length']} (lever table below): each lever is added to the best settings so "
            "far and kept if it raises validation ROUGE-1 (greedy decoding), then the decodings are scored with the "
            "best model; the family's other rows train with the chosen settings at their own source length. "
            "Test scores: ROUGE F1 x 100 (rouge_score with stemming, bootstrap mid, seeded) against the reference "
            "headlines as written; words: mean words per generated headline as ROUGE counts them (runs of letters "
            "and digits); copied: the share of generated headlines that are a headline of the training split, word "
            "for word as ROUGE reads them; training min: train_runtime (a pretraining stage included); ms per "
            "summary: the test split's prediction time (batch 32, the encoder's pass, the chosen decoding and the "
            "loss forward) per article. lead-k: the article's first k words, k chosen on the validation split. No "
            "row trains from scratch: 2,924 headlines do not teach a randomly initialized model to write (test "
            "ROUGE-1 0.7-2.0 for a Fastformer and a BART of MiniLM's size, measured before).",
            width=114,
        ),
    ]
    rows = []
    for name, spec in ROWS.items():
        row = results.get(name)
        if row is None:
            rows.append([spec.label, *("not run yet" for _ in SUMMARIZATION_COLUMNS), "", "", "", "", ""])
            continue
        minutes = f"{row['train_seconds'] / 60:.1f}" if "train_seconds" in row else "-"
        decode = f"{row['decode_ms']:.0f}" if "decode_ms" in row else "-"
        copied = statistics.fmean(copied_key(text) in training for text in row["predictions"])
        scores = [f"{row['test'][metric]:.2f}" for _, metric in SUMMARIZATION_COLUMNS]
        words = f"{mean_words(row['predictions']):.1f}"
        rows.append([spec.label, *scores, words, f"{copied:.0%}", minutes, decode, chosen_text(row)])
    header = ["model", *(title for title, _ in SUMMARIZATION_COLUMNS), "words", "copied", "training min",
              "ms per summary", "chosen on validation"]  # fmt: skip
    repeated = sum(copied_key(text) in training for text in references)
    for spec in ROWS.values():
        if spec.training:
            settings = ", ".join(f"`--{key} {value}`" for key, value in spec.training.items())
            lines += ["", *textwrap.wrap(
                f"{spec.label} trains with {settings} (batches of articles of about the same length, to fit the "
                "row in an hour: random batches of 16 pad to 2.4x their real tokens at 2,048, and the second stage "
                "runs the encoder in every step); the other rows train on random batches.", width=114)]  # fmt: skip
    threads = {row.get("threads") for name, row in results.items() if name in ROWS and "tuning" in row}
    if threads - {None}:
        lines += ["", f"The trained rows ran with {', '.join(map(str, sorted(threads - {None})))} thread(s) per run."]
    lines += ["", *table(header, rows), "", f"The reference headlines have {mean_words(references):.1f} words on "
              f"average; {repeated} of the {len(test)} are a training headline too.", ""]  # fmt: skip

    tuned = {ROWS[name].family: row["tuning"] for name, row in results.items() if name in ROWS and "tuning" in row}
    if tuned:
        labels = {lever.name: lever.label for lever in LEVERS} | {"recipe": "the recipe as it is"}
        levers = [[family, labels.get(run["lever"], run["lever"]), lever_text(run["settings"]), f"{run['rouge1']:.2f}",
                   "yes" if run["kept"] else "no", f"{run['train_seconds'] / 60:.1f}",
                   " -> ".join(f"{value:.3f}" for value in run.get("spread", []))]
                  for family, found in tuned.items() for run in found["levers"]]  # fmt: skip
        decodings = [[family, decoding_text(run["setting"]), f"{run['rouge1']:.2f}"]
                     for family, found in tuned.items() for run in found["decoding"]]  # fmt: skip
        lines += [
            "Levers, in order, on the validation split (ROUGE-1, greedy; each added to the best settings so far, kept "
            "if it", f"raised ROUGE-1; pretraining: {PRETRAIN['num_train_epochs']} epoch of the lead sentence of each "
            "unlabeled text from the rest, never a", "validation or test article, before the headlines; training min "
            "includes every stage; token-state spread: the", "encoder's, before -> after unfreezing, as "
            f"encoder_collapse.py measures it; unfreezing is kept only if it stays above {SPREAD_KEPT:.0%} of",
            "the frozen encoder's):", "",
            *table(["model family", "lever", "settings", "validation ROUGE-1", "kept", "training min",
                    "token-state spread"], levers), "",
            f"Decoding, with each family's best model ({len(DECODING)} settings; the length window: between the 5th "
            "and 95th percentile of", "the training headlines' lengths in tokens):", "",
            *table(["model family", "decoding", "validation ROUGE-1"], decodings), "",
        ]  # fmt: skip

    trained = [name for name in ROWS if name.startswith("fastformer") and "validation_rouge1" in results.get(name, {})]
    shown = max(trained, key=lambda name: results[name]["validation_rouge1"], default=None)
    columns = [(name, ROWS[name].label) for name in (shown, "bert2bert-512") if name in results]
    if columns:
        lines += [
            f"The first {EXAMPLES} test articles (their first 40 words), the reference headline and the generated",
            "ones (the Fastformer row with the best validation ROUGE-1, and BERT2BERT):", "",
        ]  # fmt: skip
        for index, article in enumerate(test[:EXAMPLES]):
            words = article["document"].split()
            lines += [f"{index + 1}. *{' '.join(words[:40])}{' ...' if len(words) > 40 else ''}*", "",
                      f"   - reference: {references[index]}"]  # fmt: skip
            lines += [f"   - {label}: {results[name]['predictions'][index]}" for name, label in columns]
            lines.append("")
    lines += ["Commands (one per row; finished runs are read back from runs/quality/headlines):", "",
              *(f"    python -m benchmarks.quality.summarization --rows {name}" for name in ROWS), "",
              "which ran, per row (pretraining, training, test prediction):", ""]  # fmt: skip
    for name in ROWS:
        lines += [f"    {command}" for command in results.get(name, {}).get("commands", [])]
    return lines + [""]


def summarization_results(runs: Path, docs: Path) -> dict:
    """The summarization runner's results by row: the report's record of them (docs/results_summarization.json),
    where the rows stored in `runs` take the place of the recorded ones."""
    return {**read_json(docs / "results_summarization.json", {}), **read_json(runs / "headlines" / "results.json", {})}


def setup() -> list[str]:
    """The report's opening: how it is made, and the classification setting (from the specs)."""
    rates, warmups = (" and ".join(dict.fromkeys(setting[index] for setting in GRID)) for index in (0, 1))
    heads, paper_heads = SIZE["num_attention_heads"], PAPER["num_attention_heads"]
    return [
        "# The paper's findings at small scale, on real data",
        "",
        "Generated by `python -m benchmarks.quality.run` (classification, one command per table) and `python -m",
        "benchmarks.quality.summarization` (summarization) from their runs; `python -m benchmarks.quality.report`",
        "regenerates this file. Every run's numbers, learning curve and command are recorded in results_runs.json",
        "(classification) and results_summarization.json, which a fresh clone regenerates from (runs stored in",
        "`runs/quality` take the place of the recorded ones of their table row).",
        "Measured on this machine's 2 CPU cores (2 threads, 24 GB, no GPU), torch 2.13 CPU, transformers 5.24.",
        "",
        f"Classification, the paper's setting scaled to what 2 CPU cores finish: 20 Newsgroups ({DATA_SIZES[0]:,} "
        "training /",
        f"{DATA_SIZES[1]:,} test documents in {Path(DATA).parent}; each table states the random subsets it used), "
        f"max length {TRAINING['max_seq_length']},",
        f"hidden {SIZE['hidden_size']} (paper: {PAPER['hidden_size']}), {heads} heads of {SIZE['hidden_size'] // heads}"
        f" (paper: {paper_heads} of {PAPER['hidden_size'] // paper_heads}), feed-forward {SIZE['intermediate_size']}, "
        f"{SIZE['num_hidden_layers']} layers, dropout {SIZE['hidden_dropout_prob']}, AdamW,",
        f"batch {TRAINING['per_device_train_batch_size']} (paper: {PAPER['per_device_train_batch_size']}), "
        f"{TRAINING['num_train_epochs']} epochs, trained from scratch. Every model is tuned the same way: a grid of "
        "learning",
        f"rate x warm-up steps (the paper's lr {rates}; {warmups.replace(' and ', ' or ')} warm-up steps) with the "
        "first seed, scored on",
        f"a validation split of other training documents; the best setting then runs with {NUMBERS[len(SEEDS) - 1]} "
        "more seeds, and the",
        f"table reports its test scores (mean +- standard deviation over the {len(SEEDS)} seeds; training s is the "
        "Trainer's",
        "train_runtime, evaluation after every epoch included). Fastformer is the paper's final model unless the row",
        "says otherwise (product interaction, query-value and layer-wise sharing, additive pooling); the Transformer",
        "is transformers' BERT with SDPA attention, same width, depth, heads and hidden dropout, no dropout on its",
        "attention weights (with it, CPU SDPA falls back to an unfused kernel that is 5x slower), classifying from",
        "the paper's additive pooling (benchmarks/quality/baselines.py) or, as BertForSequenceClassification, from",
        "[CLS].",
        "",
        MEAN_STD,
        "",
    ]


def write_report(runs: Path, destination: Path, headlines_data: Path = HEADLINES):
    raw = destination.parent / "results_runs.json"  # every run's numbers, curve and command, for the record
    tags, stored = stored_runs(runs, raw)
    by_table = load_results(stored, tags)
    write_json(raw, {"tables": tags, "runs": stored})
    lines = setup()
    for name, spec in TABLES.items():
        results = by_table.get(name, {})
        command = f"python -m benchmarks.quality.run {name} --data {DATA}"
        if not any(row.key in results for row in spec.rows):
            lines += [f"## {spec.title}", "", f"Not run yet with the tuning protocol above: `{command}` runs it.", ""]
            continue
        source, train, validation, test = tags[name].rsplit("-", 3)
        picture = plot_curves(spec, results, destination.parent)
        lines += [
            f"## {spec.title}", "",
            f"Data: {int(train):,} training, {int(validation):,} validation (other training documents) and "
            f"{int(test):,} test examples of {source}, drawn at random.", "",
            *classification_table(spec.rows, results), "", f"![learning curves]({picture})", "",
            "Command:", "", f"    {command}", "", "which ran, per model (chosen setting, first seed):", "",
            *commands(results, spec.rows), "",
        ]  # fmt: skip
    headlines = summarization_results(runs, destination.parent)
    if headlines:
        write_json(destination.parent / "results_summarization.json", headlines)
        lines += summarization_section(headlines, headlines_data)
    write_doc(destination, lines)


def main():
    parser = arguments(__doc__)
    parser.add_argument("--runs", type=Path, default=REPO / "runs" / "quality")
    parser.add_argument("--results", type=Path, default=DOCS / "RESULTS.md")
    args = parser.parse_args()
    write_report(args.runs, args.results)


if __name__ == "__main__":
    main()
