"""The example scripts end to end, as users run them: real CLI processes, tiny configs, bundled real data."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
TINY = {
    "fastformer": "hidden_size=32,num_attention_heads=4,intermediate_size=64",
    "bert": "hidden_size=32,num_hidden_layers=2,num_attention_heads=4,intermediate_size=64",
    "bart": "d_model=32,encoder_layers=1,decoder_layers=1,encoder_attention_heads=4,decoder_attention_heads=4,"
    "encoder_ffn_dim=64,decoder_ffn_dim=64",
}
COMMON = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--seed", "0", "--disable_tqdm", "true"]


def run(script, *args, launcher=(sys.executable,), check=True):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    process = subprocess.run(
        [*launcher, str(SCRIPTS / script), *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )
    if check:
        assert process.returncode == 0, f"{script} failed:\n{process.stdout[-3000:]}\n{process.stderr[-3000:]}"
    return process


def head(source, destination, rows):
    """The first `rows` lines of a bundled jsonl file."""
    lines = Path(source).read_text().splitlines()[:rows]
    destination.write_text("\n".join(lines) + "\n")
    return destination


def results(output_dir, name="eval_results.json"):
    return json.loads((Path(output_dir) / name).read_text())


def assert_hub_ready(output_dir, task, metrics_keys):
    output_dir = Path(output_dir)
    files = {p.name for p in output_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "all_results.json"} <= files
    metrics = results(output_dir)
    assert set(metrics_keys) <= metrics.keys()
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.pipeline_tag == task and card.data.library_name == "transformers"
    reported = {result.metric_type if result.metric_name is None else result.metric_name: result.metric_value
                for result in card.data.eval_results}
    for key in metrics_keys:
        assert metrics[key] in reported.values(), f"{key}={metrics[key]} not in the model-index {reported}"
    return metrics, card


@pytest.fixture(scope="module")
def newsgroups(tmp_path_factory):
    folder = tmp_path_factory.mktemp("newsgroups")
    return (head(REPO / "data/20newsgroups/train.jsonl", folder / "train.jsonl", 48),
            head(REPO / "data/20newsgroups/test.jsonl", folder / "validation.jsonl", 21))


@pytest.fixture(scope="module")
def headlines(tmp_path_factory):
    folder = tmp_path_factory.mktemp("headlines")
    return (head(REPO / "data/news_headlines/train.jsonl", folder / "train.jsonl", 16),
            head(REPO / "data/news_headlines/validation.jsonl", folder / "validation.jsonl", 6))


def from_scratch(model_type):
    return ["--model_type", model_type, "--config_overrides", TINY[model_type]]


def classify(output_dir, data, *extra, model_type="fastformer"):
    train, validation = data
    return run(
        "run_classification.py", "--output_dir", output_dir, "--do_train", "--do_eval",
        "--train_file", train, "--validation_file", validation, "--max_seq_length", 64,
        "--per_device_train_batch_size", 8, "--per_device_eval_batch_size", 4, "--max_steps", 4,
        "--learning_rate", "3e-3", *COMMON, *extra,
        *([] if "--model_name_or_path" in extra else from_scratch(model_type)),
    )


def test_classification_from_scratch_then_from_its_checkpoint(tmp_path, newsgroups):
    classify(tmp_path / "scratch", newsgroups)
    metrics, card = assert_hub_ready(tmp_path / "scratch", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert metrics["eval_samples"] == 21 and 0 <= metrics["eval_accuracy"] <= 1
    assert "fastformer" in card.data.tags and "trust_remote_code=True" in card.text
    config = json.loads((tmp_path / "scratch" / "config.json").read_text())
    assert config["model_type"] == "fastformer" and config["hidden_size"] == 32 and len(config["id2label"]) > 5

    classify(tmp_path / "tuned", newsgroups, "--model_name_or_path", tmp_path / "scratch")
    metrics, card = assert_hub_ready(tmp_path / "tuned", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert card.data.base_model is None and f"fine-tuned from `{tmp_path / 'scratch'}`" in card.text  # a local folder
    scratch, tuned = (load_file(tmp_path / name / "model.safetensors") for name in ("scratch", "tuned"))
    assert scratch.keys() == tuned.keys() and any(not torch.equal(scratch[k], tuned[k]) for k in scratch)


def test_classification_reads_csv_and_the_bert_baseline(tmp_path, newsgroups):
    csv_files = []
    for path in newsgroups:
        csv_path = tmp_path / (path.stem + ".csv")
        datasets.load_dataset("json", data_files=str(path), split="train").to_csv(csv_path)
        csv_files.append(csv_path)
    classify(tmp_path / "bert", csv_files, model_type="bert")
    metrics, card = assert_hub_ready(tmp_path / "bert", "text-classification", ["eval_accuracy", "eval_f1_macro"])
    assert json.loads((tmp_path / "bert" / "config.json").read_text())["model_type"] == "bert"
    assert "fastformer" not in (card.data.tags or []) and "trust_remote_code" not in card.text


def summarize(output_dir, data, *extra, model_type="fastformer"):
    train, validation = data
    return run(
        "run_summarization.py", "--output_dir", output_dir, "--do_train", "--do_eval", "--predict_with_generate",
        "--train_file", train, "--validation_file", validation, "--max_source_length", 64, "--max_target_length", 12,
        "--per_device_train_batch_size", 8, "--per_device_eval_batch_size", 4, "--max_steps", 3, *COMMON, *extra,
        *([] if "--model_name_or_path" in extra else from_scratch(model_type)),
    )


ROUGE = ["eval_rouge1", "eval_rouge2", "eval_rougeL", "eval_rougeLsum"]


@pytest.mark.parametrize("model_type", ["fastformer", "bart"])
def test_summarization_from_scratch(tmp_path, headlines, model_type):
    summarize(tmp_path / "out", headlines, model_type=model_type)
    metrics, card = assert_hub_ready(tmp_path / "out", "summarization", ROUGE)
    assert metrics["eval_samples"] == 6 and 0 < metrics["eval_gen_len"] <= 12
    assert all(0 <= metrics[key] <= 100 for key in ROUGE)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_type"] == model_type
    assert (tmp_path / "out" / "generation_config.json").exists()


def test_summarization_from_a_checkpoint_keeps_its_pipeline(tmp_path, headlines):
    summarize(tmp_path / "scratch", headlines)
    summarize(tmp_path / "tuned", headlines, "--model_name_or_path", tmp_path / "scratch")
    assert_hub_ready(tmp_path / "tuned", "summarization", ROUGE)
    config = json.loads((tmp_path / "tuned" / "config.json").read_text())
    assert "summarization" in config["custom_pipelines"] and (tmp_path / "tuned" / "pipeline_fastformer.py").exists()


def test_masked_lm_pretraining_then_classification(tmp_path, newsgroups):
    text = tmp_path / "text.txt"
    text.write_text("\n".join(json.loads(line)["text"] for line in newsgroups[0].read_text().splitlines()) + "\n")
    run("run_mlm.py", "--output_dir", tmp_path / "mlm", "--do_train", "--do_eval", "--train_file", text,
        "--validation_file", text, "--max_seq_length", 64, "--per_device_train_batch_size", 8, "--max_steps", 3,
        "--model_type", "fastformer", "--config_overrides", TINY["fastformer"], *COMMON)
    metrics, _ = assert_hub_ready(tmp_path / "mlm", "fill-mask", ["eval_loss"])
    assert metrics["perplexity"] == pytest.approx(torch.tensor(metrics["eval_loss"]).exp().item(), rel=1e-5)
    process = classify(tmp_path / "cls", newsgroups, "--model_name_or_path", tmp_path / "mlm")
    assert (tmp_path / "cls" / "eval_results.json").exists()
    assert "classifier.weight" in process.stdout + process.stderr  # reported as newly initialized


@pytest.mark.parametrize(
    "args, message",
    [
        (["--text_column_names", "body"], "--text_column_names: column(s) ['body'] not in the data"),
        (["--label_column_name", "topic"], "--label_column_name: column(s) ['topic'] not in the data"),
        (["--model_type", "no-such-model"], "unknown --model_type 'no-such-model'"),
        (["--config_overrides", "interaction=dot"], "`interaction` must be one of ('product', 'add', 'concat')"),
        (["--train_file", "EMPTY"], "is empty"),
        (["--train_file", "data.parquet"], "unsupported extension '.parquet'"),
    ],
    ids=["missing-text", "missing-label", "unknown-model-type", "bad-override", "empty-file", "extension"],
)
def test_bad_input_exits_with_a_clear_message(tmp_path, newsgroups, args, message):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    args = [str(empty) if arg == "EMPTY" else arg for arg in args]
    train, validation = newsgroups
    base = ["--output_dir", tmp_path / "out", "--do_train", "--do_eval", "--train_file", train,
            "--validation_file", validation, "--max_steps", 1, *COMMON]
    if "--model_type" not in args:
        base += ["--config_overrides", TINY["fastformer"]] if "--config_overrides" not in args else []
    process = run("run_classification.py", *base, *args, check=False)
    assert process.returncode != 0
    assert "run_classification.py: error: " in process.stderr and message in process.stderr, process.stderr[-2000:]


def test_two_processes_train_with_world_size_two_and_count_each_example_once(tmp_path, newsgroups):
    """accelerate launch, 2 CPU processes (gloo), as docs/SCALING.md says; 48 training and 21 evaluation texts."""
    launcher = ("accelerate", "launch", "--config_file", str(REPO / "configs/accelerate/cpu_2proc.yaml"))
    train, validation = newsgroups
    data = ["--train_file", train, "--validation_file", validation, "--test_file", validation, "--max_seq_length", 64,
            "--per_device_eval_batch_size", 4, "--do_eval", "--do_predict", *COMMON]
    run("run_classification.py", "--output_dir", tmp_path / "ddp", "--do_train", "--per_device_train_batch_size", 4,
        "--num_train_epochs", 1, "--learning_rate", "3e-3", "--model_type", "fastformer",
        "--config_overrides", TINY["fastformer"], *data, launcher=launcher)
    state = json.loads((tmp_path / "ddp" / "trainer_state.json").read_text())
    assert state["global_step"] == 48 // (4 * 2)  # each step consumed a batch on each of 2 processes
    assert "| `num_devices` | 2 |" in ModelCard.load(tmp_path / "ddp" / "README.md").text
    # the same checkpoint run by one process: the same 21 predictions in the same order and the same metrics,
    # so the 2-process gather (21 = 2 x 10 + 1 rows) dropped its padding duplicates
    run("run_classification.py", "--output_dir", tmp_path / "single", "--model_name_or_path", tmp_path / "ddp", *data)
    predictions = [(tmp_path / name / "predictions.jsonl").read_text().splitlines() for name in ("ddp", "single")]
    assert len(predictions[0]) == 21 and predictions[0] == predictions[1]
    distributed, single = results(tmp_path / "ddp"), results(tmp_path / "single")
    assert distributed["eval_samples"] == single["eval_samples"] == 21
    assert distributed["eval_accuracy"] == single["eval_accuracy"]
    assert distributed["eval_f1_macro"] == pytest.approx(single["eval_f1_macro"], abs=1e-12)
    # (eval_loss is transformers' mean of per-batch losses: it depends on how batches fall, so it is not compared)


def test_two_processes_reach_the_weights_of_one_process_with_the_same_global_batch(tmp_path, newsgroups):
    """DDP (2 CPU processes x 4 examples) and 1 process x 8 examples take the same steps: the same 8 examples per
    step (accelerate shards one seeded order), gradients averaged over them. No dropout, so that the random
    streams (which differ per process) play no part. Checkpoints after every step are compared."""
    train, validation = newsgroups
    args = ["--do_train", "--train_file", train, "--validation_file", validation, "--max_seq_length", 64,
            "--max_steps", 3, "--learning_rate", "3e-3", "--model_type", "fastformer", *COMMON,
            "--save_strategy", "steps", "--save_steps", 1,
            "--config_overrides", TINY["fastformer"] + ",hidden_dropout_prob=0.0"]  # the classifier's too
    launcher = ("accelerate", "launch", "--config_file", str(REPO / "configs/accelerate/cpu_2proc.yaml"))
    run("run_classification.py", "--output_dir", tmp_path / "ddp", "--per_device_train_batch_size", 4, *args,
        launcher=launcher)
    run("run_classification.py", "--output_dir", tmp_path / "single", "--per_device_train_batch_size", 8, *args)
    for step in (1, 2, 3):
        distributed, single = (load_file(tmp_path / name / f"checkpoint-{step}" / "model.safetensors")
                               for name in ("ddp", "single"))
        assert distributed.keys() == single.keys()
        for name in single:
            torch.testing.assert_close(distributed[name], single[name], rtol=1e-4, atol=1e-5, msg=f"{step}: {name}")
    first = load_file(tmp_path / "single" / "checkpoint-1" / "model.safetensors")
    assert max((single[name] - first[name]).abs().max().item() for name in single) > 1e-3  # the steps moved them
    # (train_loss is not compared: with 2 processes the Trainer reports the main process's own mean)


def test_dataset_name_loads_like_a_hub_data_set(tmp_path, newsgroups):
    """--dataset_name goes through datasets.load_dataset as for a Hub id; a local folder of split files is the
    offline stand-in (datasets infers the splits from the file names)."""
    folder = tmp_path / "newsgroups_dataset"
    folder.mkdir()
    for path in newsgroups:
        (folder / path.name).write_text(path.read_text())
    run("run_classification.py", "--output_dir", tmp_path / "out", "--do_train", "--do_eval", "--dataset_name",
        folder, "--max_seq_length", 64, "--per_device_train_batch_size", 8, "--max_steps", 2,
        *from_scratch("fastformer"), *COMMON)
    metrics = results(tmp_path / "out")
    assert metrics["eval_samples"] == 21
    assert ModelCard.load(tmp_path / "out" / "README.md").data.datasets == [str(folder)]
