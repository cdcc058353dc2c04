"""The performance benchmarks run at toy size, in this process, and write well-formed records and figures; the
encoder's limits skip what would not fit."""

import csv
import json
from argparse import Namespace

import pytest
import torch

from benchmarks import decoding, deploy, encoder, gpu, harness, operators, parity
from fastformer import FastformerForSequenceClassification

TOY_ENCODER = "--hidden-size 32 --layers 1 --heads 4 --intermediate-size 64 --vocab-size 1100 --threads 1".split()


def read_record(path):
    """The JSON record and the rows of the CSV beside it."""
    return json.loads(path.read_text()), list(csv.DictReader(path.with_suffix(".csv").open()))


def test_operator_count_leaves_views_out_and_counts_host_reads():
    x = torch.randn(4, 6)
    with operators.OperatorCount() as counted:
        x.view(6, 4).transpose(0, 1).detach()  # views and a detach: no work
        (x @ x.T).sum().item()
    assert counted.compute == {"aten::mm": 1, "aten::sum": 1, "aten::_local_scalar_dense": 1}
    assert counted.host_reads == 1


def test_operators_benchmark_counts_both_models_each_step(tmp_path, capsys):
    flags = "--hidden-size 32 --layers 2 --heads 4 --shapes 2x16 1x64 --training-shapes 2x16 --threads 1"
    flags += " --decoding-prompts 8"
    rows = operators.main([*flags.split(), "--output", str(tmp_path / "operators.json")])
    record, csv_rows = read_record(tmp_path / "operators.json")
    # 3 classifiers x (2 inference, 2 training), 2 decoders x 1 decoding step
    assert len(record["rows"]) == len(csv_rows) == len(rows) == 3 * 4 + 2
    assert all(row["operators"] > 0 for row in rows)
    fastformer = [row for row in rows if row["model"].startswith("Fastformer")]
    assert all(row["host_reads"] == 0 for row in fastformer)  # no value read by default
    assert all(row["vs_peer"] > 0 for row in fastformer)
    by_step = {(row["model"], row["step"], row["length"], row["dtype"]): row["operators"] for row in rows}
    added = {  # by the [CLS] row: one layer's worth (about a dozen forward, four times that with the backward)
        (kind, length, dtype): operators_ - by_step[("Fastformer", kind, length, dtype)]
        for (model, kind, length, dtype), operators_ in by_step.items()
        if model == "Fastformer, [CLS] softmax"
    }
    assert added[("inference", 16, "float32")] == added[("inference", 64, "float32")] <= 15  # not per token
    assert all(0 < count <= 60 for count in added.values())
    output = capsys.readouterr().out
    assert "| BERT-SDPA | inference | 2 | 16 |" in output and "| GPT-2-SDPA | decoding step | 1 | 8 |" in output


def test_gpu_benchmark_runs_every_measurement_at_toy_size_on_the_cpu(tmp_path, capsys):
    """`python -m benchmarks.gpu` on the CPU: the correctness check (the fused poolings against the weights path and
    a float64 copy), then every model at every shape, and the ratios the targets read."""
    flags = "--device cpu --dtype bfloat16 --hidden-size 32 --layers 2 --heads 4 --vocab-size 1100 --repeats 1"
    flags += " --forward-shapes 2x16 1x48 --training-shapes 2x16 --decoding-shapes 2x8 --new-tokens 3"
    record = gpu.main([*flags.split(), "--output", str(tmp_path / "gpu.json")])
    stored, csv_rows = read_record(tmp_path / "gpu.json")
    # encoder: 3 models x 2 shapes; training, decoding and generate() (eager only off a GPU): 2 models each
    assert stored["rows"] == record["rows"] and len(csv_rows) == len(record["rows"]) == 3 * 2 + 2 + 2 + 2
    float32, bf16 = record["checks"]
    assert float32["dtype"] == "float32" and float32["vs_weights_path"] < 1e-5 and float32["vs_float64_cpu"] < 1e-5
    assert bf16["dtype"] == "bfloat16" and bf16["vs_float64_cpu"] < 0.1
    for row in record["rows"]:
        timed = {"encoder": ("forward_ms", "forward_backward_ms"), "training step": ("step_ms",)}
        timed["decoding"] = ("prefill_ms", "ms_per_token")
        timed["generate, eager"] = ()  # its ms per token, the call less the prefill: noise at toy size
        assert row["what"] != "generate, eager" or isinstance(row["ms_per_token"], float)
        assert all(row[column] > 0 for column in timed[row["what"]]), row
    over = {(ratio["what"], ratio["column"], ratio["over"]) for ratio in record["ratios"]}
    assert ("encoder", "forward_ms", "floor") in over and ("training step", "step_ms", "BERT-SDPA") in over
    assert ("decoding", "ms_per_token", "GPT-2-SDPA") in over
    assert "| decoding | GPT-2-SDPA | 2 |" in capsys.readouterr().out


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
    assert "above --max-seconds 60" in encoder.skip_reason("BERT", 32768, history, args)
    history = {("BigBird", "seconds"): [(8192, 10.0)], ("BigBird", "peak_gb"): [(4096, 2.0), (8192, 7.0)]}
    assert "above --max-memory-gb 10" in encoder.skip_reason("BigBird", 16384, history, args)


def test_encoder_benchmark_measures_each_model_and_skips_what_would_not_fit(tmp_path, monkeypatch, capsys):
    def peak_here(prepare, *args):  # harness.peak_megabytes spawns an interpreter per model and length: seconds each
        prepare(*args)()
        return 12.5

    monkeypatch.setattr(harness, "peak_megabytes", peak_here)
    models = ["Fastformer", "Fastformer-plain", "floor", "BERT"]
    # --max-seconds below any forward+backward: every model is predicted too slow for the second length
    flags = "--lengths 32 16 --repeats 2 --iterations 1 --max-seconds 1e-9".split()
    encoder.main([*TOY_ENCODER, *flags, "--models", *models, "--output", str(tmp_path / "encoder.json")])
    record, csv_rows = read_record(tmp_path / "encoder.json")
    assert record["settings"]["lengths"] == [16, 32] and set(record["parameters"]) == set(models)
    assert record["machine"]["command"] and len(csv_rows) == len(record["rows"])
    measured = [row for row in record["rows"] if "note" not in row]
    assert sorted((row["model"], row["repeat"]) for row in measured) == sorted((m, r) for m in models for r in (0, 1))
    for row in measured:
        assert row["length"] == 16 and row["forward_ms"] > 0 and row["forward_backward_ms"] > 0
        assert row["forward_iterations"] == row["forward_backward_iterations"] == 1 and row["peak_mb"] == 12.5
    skipped = [row for row in record["rows"] if "note" in row]
    assert {row["model"] for row in skipped} == set(models) and all(row["length"] == 32 for row in skipped)
    assert all("above --max-seconds" in row["note"] for row in skipped)
    printed = capsys.readouterr().out
    assert all(f"| {name} |" in printed for name in models) and "| Fastformer / floor | 16 |" in printed
    assert (tmp_path / "encoder_time.png").stat().st_size > 0 and (tmp_path / "encoder_memory.png").stat().st_size > 0
    with pytest.raises(SystemExit):  # not a model it knows
        encoder.parse_args(["--models", "GPT"])


@pytest.mark.slow
def test_encoder_peak_memory_is_measured_in_a_fresh_process():
    args = encoder.parse_args([*TOY_ENCODER, "--lengths", "64"])
    assert harness.peak_megabytes(encoder.prepare_forward_backward, "floor", 64, args) > 0


def test_encoder_profile_records_the_top_operators(tmp_path, capsys):
    models = ["Fastformer", "Fastformer-plain", "floor"]
    output = str(tmp_path / "profile.json")
    encoder.main([*TOY_ENCODER, "--profile", "3", "--lengths", "16", "--models", *models, "--output", output])
    record, csv_rows = read_record(tmp_path / "profile.json")
    assert len(record["rows"]) == len(csv_rows) == 3 * 2 * 3  # models x steps x operators
    steps = {(row["model"], row["step"]) for row in record["rows"]}
    assert steps == {(name, step) for name in models for step in ("forward", "forward+backward")}
    assert all(0 < row["share"] <= 1 and row["self_ms"] <= row["total_ms"] for row in record["rows"])
    assert "| aten::" in capsys.readouterr().out and not (tmp_path / "encoder_time.png").exists()


def test_decoding_benchmark_times_both_models_and_generate(tmp_path, capsys):
    flags = "--lengths 32 16 --repeats 2 --threads 1 --source-length 16 --hidden-size 32 --heads 4"
    flags += " --intermediate-size 37 --encoder-layers 1 --decoder-layers 2 --generate-tokens 4"
    decoding.main([*flags.split(), "--output", str(tmp_path / "decoding.json")])
    record, csv_rows = read_record(tmp_path / "decoding.json")
    assert len(record["rows"]) == len(csv_rows) == 2 * 2 * 2  # models x repeats x lengths
    assert all(row["ms_per_token"] > 0 for row in record["rows"])
    cache = {(row["model"], row["generated_tokens"]): row["cache_bytes"] for row in record["rows"]}
    assert cache["Fastformer", 16] == cache["Fastformer", 32] > 0  # a state of constant size
    assert cache["BART", 32] > cache["BART", 16]  # keys and values of every token
    assert {name: len(ms) for name, ms in record["generate_ms_per_token"].items()} == {"Fastformer": 2, "BART": 2}
    printed = capsys.readouterr().out
    assert all(f"| {cell} |" in printed for cell in (16, 32, "Fastformer", "BART")), printed
    assert (tmp_path / "decoding.png").stat().st_size > 0
    with pytest.raises(SystemExit):  # a length shorter than the steps averaged
        decoding.parse_args(["--lengths", "8"])


@pytest.mark.slow
def test_deploy_benchmark_measures_onnx_runtime_beside_pytorch(build, tokenizer, tmp_path):
    labels = dict(num_labels=2, id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
    classifier = build(FastformerForSequenceClassification, num_hidden_layers=1, vocab_size=len(tokenizer), **labels)
    classifier.save_pretrained(tmp_path / "classifier")
    tokenizer.save_pretrained(tmp_path / "classifier")
    texts = [{"text": f"text number {n} " * (n % 7 + 1), "label": ["no", "yes"][n % 2]} for n in range(40)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(row) + "\n" for row in texts))
    size = '{"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 37}'
    flags = "--lengths 16 40 --repeats 1 --calls 1 --threads 1 --source_lengths 16 --new_tokens 5".split()
    flags += ["--max_length", "48"]
    files = ["--classifier", tmp_path / "classifier", "--test_file", tmp_path / "test.jsonl"]
    deploy.main([*flags, "--size", size, *map(str, files), "--output", str(tmp_path / "deploy.json")])
    record, csv_rows = read_record(tmp_path / "deploy.json")
    rows = {(row["part"], row.get("tokens"), row["runtime"]): row for row in record["rows"]}
    assert len(csv_rows) == len(rows) == 2 * 3 + 2 + 3  # latency, decoding, accuracy
    for length in (16, 40):
        assert all(rows["latency", length, name]["ms"] > 0 for name in ("PyTorch eager", "ONNX Runtime fp32"))
        assert rows["latency", length, "ONNX Runtime fp32"]["max_abs_difference"] <= 1e-4
        assert rows["latency", length, "ONNX Runtime int8"]["max_abs_difference"] > 1e-4  # not the float32 graph
    for name in ("PyTorch generate", "ONNX Runtime loop"):
        row = rows["decoding", 16, name]
        assert row["same_tokens"] and row["ms_per_token"] > 0
        assert row["state_bytes"] == 2 * (4 + 4 * 8) * 4  # 1 layer x 2 poolings x (H + H x D) float32
    fp32, eager = rows["accuracy", None, "ONNX Runtime fp32"], rows["accuracy", None, "PyTorch eager"]
    assert fp32["texts"] == 40 and fp32["agreement"] == 1.0 and fp32["accuracy"] == eager["accuracy"]
    assert record["settings"]["new_tokens"] == 5 and record["settings"]["classifier"].endswith("classifier")


def test_parity_benchmark_records_each_comparison(tmp_path):
    parity.main(["--seq-len", "24", "--decode-tokens", "6", "--threads", "1", "--output", str(tmp_path / "p.json")])
    record, csv_rows = read_record(tmp_path / "p.json")
    rows = {(row["what"], row["dtype"], row["compared_with"]): row for row in record["rows"]}
    assert len(rows) == len(csv_rows) == 2 * 4 + 3 + 1  # on the CPU
    for what in ("additive_attention", "causal_additive_attention"):
        assert rows[what, "float64", "loop reference"]["max_abs_error"] < 1e-12
        assert rows[what, "float32", "float64"]["relative_error"] < 1e-5
        assert 1e-5 < rows[what, "bfloat16", "float64"]["relative_error"] < 0.05
    assert rows["FastformerModel", "float32", "float64"]["relative_error"] < 1e-5
    assert rows["seq2seq decoding, token by token", "float32", "full forward"]["tokens"] == 6
