"""The quality benchmarks at toy size, their scripts run in this process: a classification table (tuning grid, then
seeds), the Transformer baseline, the training-step timing and the encoder-collapse curves; each writes its record."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, BertConfig, BertModel

from benchmarks import harness
from benchmarks.quality import baselines, encoder_collapse, run, training_step
from fastformer.conversion import convert_bert
from tests.in_process import run_in_process


@pytest.fixture
def in_process(monkeypatch):
    monkeypatch.setattr(harness, "run", run_in_process)


TOY = "hidden_size=16,num_attention_heads=2,intermediate_size=32,num_hidden_layers=1"


@pytest.mark.slow
def test_a_table_tunes_each_model_on_validation_then_runs_the_best_setting_with_more_seeds(
    repo_root, tmp_path, in_process, monkeypatch, capsys
):
    toy = [("product", "fastformer", TOY), ("concat", "fastformer", TOY + ",interaction=concat")]
    monkeypatch.setitem(run.TABLES, "interaction", toy)
    monkeypatch.setattr(
        run, "TRAINING", {"max_seq_length": 16, "num_train_epochs": 2, "per_device_train_batch_size": 8}
    )
    data = ["--data", str(repo_root / "data" / "20newsgroups"), "--samples", "24", "16", "16"]
    argv = ["interaction", *data, "--seeds", "0", "1", "--grid", "1e-3,2", "3e-4,2", "--runs", str(tmp_path / "runs")]
    argv += ["--docs", str(tmp_path / "docs")]
    run.main(argv)
    record = json.loads((tmp_path / "docs" / "results_interaction.json").read_text())
    rows = record["rows"]
    assert [row["model"] for row in rows] == ["product"] * 3 + ["concat"] * 3
    for model in ("product", "concat"):
        runs = [row for row in rows if row["model"] == model]
        grid, second = runs[:2], runs[2]
        assert [(row["learning_rate"], row["seed"]) for row in grid] == [("1e-3", 0), ("3e-4", 0)]
        best = max(grid, key=lambda row: row["eval_accuracy"])
        assert second["learning_rate"] == best["learning_rate"]  # the second seed runs the best validation setting
    assert all(
        len(row["curve"]) == 2 and {"test_accuracy", "test_f1_macro", "parameters"} <= row.keys() for row in rows
    )
    assert len({row["parameters"] for row in rows}) == 2  # concat adds two projections per layer
    assert record["settings"]["grid"] == [["1e-3", "2"], ["3e-4", "2"]] and record["machine"]["command"]
    assert (tmp_path / "docs" / "results_interaction.csv").exists()
    printed = capsys.readouterr().out
    assert "| product |" in printed and "| concat |" in printed

    # the stored runs are read back, not trained again
    monkeypatch.setattr(harness, "run", lambda *args: pytest.fail("a stored run ran again"))
    run.main(argv)
    again = json.loads((tmp_path / "docs" / "results_interaction.json").read_text())["rows"]
    assert [row["test_accuracy"] for row in again] == [row["test_accuracy"] for row in rows]


def test_a_missing_data_file_is_refused(tmp_path):
    with pytest.raises(SystemExit, match="train.jsonl not found"):
        run.main(["sharing", "--data", str(tmp_path), "--runs", str(tmp_path / "runs")])


def test_the_transformer_baseline_with_the_papers_pooling_ignores_padding(tmp_path):
    config = AutoConfig.for_model(
        "bert_additive_pooling",
        vocab_size=50,
        hidden_size=16,
        num_attention_heads=2,
        intermediate_size=32,
        num_hidden_layers=2,
        num_labels=3,
    )
    model = AutoModelForSequenceClassification.from_config(config).eval()
    assert isinstance(model, baselines.BertAdditivePoolingForSequenceClassification) and model.bert.pooler is None
    ids = torch.randint(1, 50, (2, 7))
    padded = torch.cat([ids, torch.zeros(2, 3, dtype=torch.long)], dim=1)
    mask = (padded != 0).long()
    torch.testing.assert_close(model(padded, attention_mask=mask).logits, model(ids).logits)
    loss = model(padded, attention_mask=torch.zeros_like(mask), labels=torch.tensor([0, 2])).loss
    assert torch.isfinite(loss)
    model.save_pretrained(tmp_path)
    torch.testing.assert_close(
        AutoModelForSequenceClassification.from_pretrained(tmp_path)(ids).logits, model(ids).logits
    )


def test_the_baseline_script_trains_it_with_run_classification(tmp_path):
    command = [
        "python",
        "-m",
        "benchmarks.quality.baselines",
        "--model_type",
        "bert_additive_pooling",
        "--config_overrides",
        "hidden_size=16,num_attention_heads=2,intermediate_size=32,num_hidden_layers=1",
        "--output_dir",
        str(tmp_path / "run"),
        "--do_train",
        "--do_eval",
        "--max_seq_length",
        "32",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "8",
        "--num_train_epochs",
        "1",
        "--report_to",
        "none",
    ]
    process = run_in_process(command)
    assert process.returncode == 0, process.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["model_type"] == "bert_additive_pooling"
    assert "eval_accuracy" in json.loads((tmp_path / "run" / "all_results.json").read_text())


def test_the_training_step_benchmark_times_every_mode_of_both_models(tmp_path, capsys):
    size = "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=37,vocab_size=1100"
    output = tmp_path / "training_step.json"
    argv = ["--sources", "8", "16", "--batch-size", "2", "--repeats", "1", "--size", size, "--output", str(output)]
    training_step.main([*argv, "--threads", "1"])
    rows = json.loads(output.read_text())["rows"]
    assert [(row["model"], row["source_tokens"]) for row in rows] == [
        ("Fastformer", 8),
        ("Fastformer", 16),
        ("BERT2BERT", 8),
        ("BERT2BERT", 16),
    ]
    modes = ("end_to_end", "cached", "cached_fixed_kv", "encoder")
    assert all(row[mode] > 0 for row in rows for mode in modes)
    assert "| BERT2BERT | 16 |" in capsys.readouterr().out


@pytest.mark.slow
def test_the_encoder_collapse_benchmark_follows_each_model_fine_tuned_and_frozen(tokenizer, tmp_path):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=256,
    )
    bert = BertModel(config, add_pooling_layer=False)
    for folder, model in ((tmp_path / "bert", bert), (tmp_path / "converted", convert_bert(bert, task="seq2seq"))):
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    output = tmp_path / "encoder_collapse.json"
    argv = ["--converted", str(tmp_path / "converted"), "--source", str(tmp_path / "bert"), "--steps", "1"]
    encoder_collapse.main([*argv, "--threads", "1", "--output", str(output)])
    rows = json.loads(output.read_text())["rows"]
    labels = [f"{name}, encoder {state}" for name in ("fastformer", "bert2bert") for state in ("fine-tuned", "frozen")]
    assert [(row["model"], row["step"]) for row in rows] == [(label, step) for label in labels for step in (0, 1)]
    assert all(row["spread"] > 0 and row["loss"] > 0 and row["loss_other_article"] > 0 for row in rows)
    frozen = [row["spread"] for row in rows if row["model"] == "fastformer, encoder frozen"]
    assert frozen[0] == pytest.approx(frozen[1])  # a frozen encoder's states do not move
