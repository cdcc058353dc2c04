"""`python -m benchmarks.quality.run` end to end at toy size: a table's tuning grid and seeds, the report, reuse of
finished runs."""

import json
import re
import shutil
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification

from benchmarks.quality import baselines  # registers the Transformer baseline with the paper's pooling
from benchmarks.quality.report import RESULT, TABLES_FILE, stored_runs, summarization_results, write_report


def run_table(repo_root, table, tmp_path):
    command = [
        sys.executable, "-m", "benchmarks.quality.run", table, "--in-process",
        "--data", str(repo_root / "data" / "20newsgroups"), "--seeds", "0", "1", "--grid", "1e-3,2", "3e-4,2",
        "--train-samples", "40", "--validation-samples", "16", "--test-samples", "16",
        "--runs", str(tmp_path / "runs"), "--results", str(tmp_path / "docs" / "RESULTS.md"),
        "--extra", "--num_train_epochs", "2", "--max_seq_length", "32", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    (tmp_path / "docs").mkdir(exist_ok=True)
    process = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=repo_root)
    assert process.returncode == 0, process.stderr[-3000:] + process.stdout[-3000:]
    return process.stdout


def trained(log):
    """The (model, learning rate, seed) of each run a table's log says it trained."""
    return re.findall(r"\] (.+?), lr (\S+), warm-up \d+, seed (\d+): ", log)


def interaction(run):
    overrides = run["overrides"]
    return overrides.split("interaction=")[1] if "interaction=" in overrides else "product"


@pytest.mark.slow
def test_a_table_tunes_each_model_on_validation_then_runs_the_best_setting_with_more_seeds(repo_root, tmp_path):
    log = run_table(repo_root, "interaction", tmp_path)
    runs = json.loads((tmp_path / "docs" / "results_runs.json").read_text())["runs"]
    for model in ("product", "add", "concat"):
        done = [(rate, seed) for label, rate, seed in trained(log) if label == model]
        assert done[:2] == [("1e-3", "0"), ("3e-4", "0")] and len(done) == 3 and done[2][1] == "1"
        mine = [run for run in runs if interaction(run) == model]
        first = {run["learning_rate"]: run["metrics"]["eval_accuracy"] for run in mine if run["seed"] == 0}
        assert done[2][0] == max(first, key=first.get)  # the second seed runs the setting best on validation
    assert len(runs) == 9 and all(len(run["curve"]) == 2 for run in runs)  # evaluated after each of 2 epochs
    assert all({"eval_accuracy", "test_accuracy", "test_f1_macro"} <= run["metrics"].keys() for run in runs)
    assert len({run["parameters"] for run in runs}) == 2  # concat adds two projections per layer
    report = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "## RQ2: the interaction function" in report and "results_interaction.png" in report
    rows = [line for line in report.splitlines() if line.startswith(("| product", "| add", "| concat"))]
    assert len(rows) == 6  # the table (test scores of the chosen setting, 2 seeds) and the grid
    assert all("not run" not in row for row in rows) and sum(row.endswith("| 2 |") for row in rows) == 3
    assert "| model | lr 1e-3, warm-up 2 | lr 3e-4, warm-up 2 |" in report
    assert (tmp_path / "docs" / "results_interaction.png").stat().st_size > 0

    # a person's reading survives regeneration; finished runs are read back, not trained again
    (tmp_path / "docs" / "RESULTS.md").write_text(report + "\n## Reading\n\nProduct wins here.\n")
    assert trained(run_table(repo_root, "interaction", tmp_path)) == []
    report = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "## RQ2" in report and report.rstrip().endswith("## Reading\n\nProduct wins here.")

    # a fresh clone has no runs, only what docs/ records: regenerating the report keeps every measured run
    shutil.rmtree(tmp_path / "runs")
    write_report(tmp_path / "runs", tmp_path / "docs" / "RESULTS.md")
    assert (tmp_path / "docs" / "RESULTS.md").read_text() == report
    assert json.loads((tmp_path / "docs" / "results_runs.json").read_text())["runs"] == runs


def test_the_record_in_docs_is_the_base_and_local_runs_take_the_place_of_their_rows(tmp_path):
    def run(model_type, seed, accuracy, data="news-10-5-5"):
        return {"data": data, "model_type": model_type, "overrides": "", "extra": "", "learning_rate": "1e-3",
                "warmup_steps": "20", "seed": seed, "metrics": {"eval_accuracy": accuracy},
                "command": f"python run.py {model_type} {seed}"}  # fmt: skip

    docs, runs = tmp_path / "docs", tmp_path / "runs"
    docs.mkdir()
    recorded = [run("bert", 0, 0.5), run("bert", 1, 0.6), run("fastformer", 0, 0.7), run("bert", 0, 0.1, "other")]
    record = docs / "results_runs.json"
    record.write_text(json.dumps({"tables": {"classification": "news-10-5-5", "sharing": "other"}, "runs": recorded}))
    assert stored_runs(runs, record) == ({"classification": "news-10-5-5", "sharing": "other"},
                                         sorted(recorded, key=lambda r: (r["data"], r["command"])))  # fmt: skip
    # bert re-run here with one seed: its recorded seeds of that data are gone, the other rows and data stay
    local = run("bert", 0, 0.9)
    (runs / "news-10-5-5" / "bert-default" / "seed0").mkdir(parents=True)
    (runs / "news-10-5-5" / "bert-default" / "seed0" / RESULT).write_text(json.dumps(local))
    (runs / TABLES_FILE).write_text(json.dumps({"sharing": "news-10-5-5"}))
    tags, stored = stored_runs(runs, record)
    assert tags == {"classification": "news-10-5-5", "sharing": "news-10-5-5"}
    assert stored == [local, recorded[2], recorded[3]]  # by data, then command

    summaries = {"lead": {"test": 1}, "bart-scratch": {"test": 2}}
    (docs / "results_summarization.json").write_text(json.dumps(summaries))
    assert summarization_results(runs, docs) == summaries
    (runs / "headlines").mkdir()
    (runs / "headlines" / "results.json").write_text(json.dumps({"lead": {"test": 3}}))
    assert summarization_results(runs, docs) == {"lead": {"test": 3}, "bart-scratch": {"test": 2}}


def test_the_transformer_baseline_with_the_papers_pooling_ignores_padding(tmp_path):
    config = AutoConfig.for_model("bert_additive_pooling", vocab_size=50, hidden_size=16, num_attention_heads=2,
                                  intermediate_size=32, num_hidden_layers=2, num_labels=3)  # fmt: skip
    model = AutoModelForSequenceClassification.from_config(config).eval()
    assert isinstance(model, baselines.BertAdditivePoolingForSequenceClassification) and model.bert.pooler is None
    ids = torch.randint(1, 50, (2, 7))
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = (padded != 0).long()
    torch.testing.assert_close(model(padded, attention_mask=mask).logits, model(ids).logits)
    loss = model(padded, attention_mask=torch.zeros_like(mask), labels=torch.tensor([0, 2])).loss
    assert torch.isfinite(loss)
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(AutoModelForSequenceClassification.from_pretrained(tmp_path)(ids).logits,
                               model(ids).logits)  # fmt: skip


def test_the_baseline_script_trains_it_with_run_classification(repo_root, tmp_path):
    command = [
        sys.executable, "-m", "benchmarks.quality.baselines", "--model_type",
        "bert_additive_pooling", "--config_overrides", "hidden_size=16,num_attention_heads=2,intermediate_size=32,"
        "num_hidden_layers=1", "--output_dir", str(tmp_path / "run"), "--do_train", "--do_eval", "--max_seq_length",
        "32", "--max_train_samples", "16", "--max_eval_samples", "8", "--num_train_epochs", "1", "--report_to", "none",
    ]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=repo_root)
    assert process.returncode == 0, process.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_type"] == "bert_additive_pooling"
    assert "eval_accuracy" in json.loads((tmp_path / "run" / "all_results.json").read_text())
