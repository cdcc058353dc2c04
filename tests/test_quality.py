"""benchmarks/quality/run.py end to end at toy size: a table's runs, the report, reuse of finished runs."""

import json
import re
import subprocess
import sys

import pytest


def run_table(repo_root, table, tmp_path):
    command = [
        sys.executable, str(repo_root / "benchmarks" / "quality" / "run.py"), table,
        "--data", str(repo_root / "data" / "20newsgroups"),
        "--seeds", "0", "--train-samples", "40", "--eval-samples", "16", "--runs", str(tmp_path / "runs"),
        "--results", str(tmp_path / "docs" / "RESULTS.md"),
        "--extra", "--num_train_epochs", "2", "--max_seq_length", "32", "--per_device_train_batch_size", "8",
    ]  # fmt: skip
    (tmp_path / "docs").mkdir(exist_ok=True)
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert process.returncode == 0, process.stderr[-3000:] + process.stdout[-3000:]
    return process.stdout


def trained(log):
    """The (model, seed) pairs a table's log says it trained."""
    return re.findall(r"\] (.+?), seed (\d+): ", log)


@pytest.mark.slow
def test_a_table_trains_each_model_once_and_reports_it(repo_root, tmp_path):
    log = run_table(repo_root, "interaction", tmp_path)
    assert trained(log) == [("product", "0"), ("add", "0"), ("concat", "0")]
    report = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "## RQ2: the interaction function" in report and "results_interaction.png" in report
    rows = [line for line in report.splitlines() if line.startswith(("| product", "| add", "| concat"))]
    assert len(rows) == 3 and all("not run" not in row and "| 1 |" in row for row in rows)
    runs = json.loads((tmp_path / "docs" / "results_runs.json").read_text())
    assert len(runs) == 3 and all(len(run["curve"]) == 2 for run in runs)  # evaluated after each of 2 epochs
    assert len({run["parameters"] for run in runs}) == 2  # concat adds two projections per layer
    assert (tmp_path / "docs" / "results_interaction.png").stat().st_size > 0

    # a person's reading survives regeneration; the default Fastformer run is reused by the sharing table
    (tmp_path / "docs" / "RESULTS.md").write_text(report + "\n## Reading\n\nProduct wins here.\n")
    log = run_table(repo_root, "sharing", tmp_path)
    assert trained(log) == [("none", "0"), ("query-value", "0"), ("query-value + head-wise", "0")]
    report = (tmp_path / "docs" / "RESULTS.md").read_text()
    assert "## RQ3: parameter sharing" in report and "## RQ2" in report
    assert report.rstrip().endswith("## Reading\n\nProduct wins here.")
