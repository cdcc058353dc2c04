"""The README's example runs as written, and CI runs the README's test command."""

import json
import os
import re
import runpy
import shlex
import subprocess
import sys

import pytest
import torch

from tests.in_process import run_in_process


def run_example(repo_root, heading, tmp_path, monkeypatch):
    readme = (repo_root / "README.md").read_text()
    example = re.search(heading + r"\n\n```python\n(.*?)```", readme, re.S).group(1)
    (tmp_path / "data").symlink_to(repo_root / "data")
    (tmp_path / "example.py").write_text(example)
    monkeypatch.chdir(tmp_path)
    return runpy.run_path("example.py")


def test_usage_example_runs(repo_root, tmp_path, monkeypatch):
    namespace = run_example(repo_root, "## Usage", tmp_path, monkeypatch)
    assert namespace["logits"].shape == (2, 2)
    assert (tmp_path / "my-fastformer" / "model.safetensors").exists()
    with torch.no_grad():
        assert torch.equal(namespace["reloaded"].eval()(**namespace["batch"]).logits, namespace["logits"])


def test_generation_example_runs(repo_root, tmp_path, monkeypatch):
    namespace = run_example(repo_root, "### Generation with a constant-size state", tmp_path, monkeypatch)
    summary_ids = namespace["summary_ids"]
    assert summary_ids.shape[0] == 1 and 1 < summary_ids.shape[1] <= 33
    assert summary_ids[0, 0] == namespace["tokenizer"].cls_token_id


def quickstart_commands(repo_root):
    section = (repo_root / "README.md").read_text().split("## Quickstart", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.*?)\n```", section, re.S)


def test_quickstart_has_exactly_the_main_job_and_the_tests(repo_root):
    main_job, tests = quickstart_commands(repo_root)
    assert main_job.startswith('pip install -e ".[train]" && python scripts/run_classification.py')
    assert tests == 'pip install -e ".[test]" && python -m pytest -q'


def test_ci_runs_the_readme_test_command(repo_root):
    tests = quickstart_commands(repo_root)[1]
    assert tests in (repo_root / ".ci" / "run").read_text().splitlines()


@pytest.mark.slow
def test_main_job_command_runs(repo_root, tmp_path):
    """The README's main job as written, cut short: the later flags override the same flags of the command."""
    command = shlex.split(quickstart_commands(repo_root)[0].split("&&", 1)[1])
    assert command[:2] == ["python", "scripts/run_classification.py"] and "--do_train" in command
    short = [
        "--output_dir",
        str(tmp_path),
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "16",
        "--max_steps",
        "2",
        "--config_overrides",
        "hidden_size=32,num_attention_heads=4,intermediate_size=64",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    process = subprocess.run(
        [sys.executable, *command[1:], *short], cwd=repo_root, env=env, capture_output=True, text=True, timeout=600
    )
    assert process.returncode == 0, process.stderr[-3000:]
    metrics = json.loads((tmp_path / "eval_results.json").read_text())
    assert metrics["eval_samples"] == 16 and "eval_f1_macro" in metrics
    assert (tmp_path / "README.md").exists() and (tmp_path / "model.safetensors").exists()


def conversion_commands(repo_root):
    section = (repo_root / "README.md").read_text().split("## Pretrained Fastformers from BERT checkpoints", 1)[1]
    return re.findall(r"```bash\n(.*?)\n```", section.split("\n## ", 1)[0], re.S)


@pytest.mark.slow
def test_conversion_recipe_runs(repo_root, tmp_path, tokenizer, monkeypatch):
    """The README's conversion and fine-tuning commands as written, on a tiny BERT and cut short (later flags
    override the same flags of the command), each script run in this process."""
    from transformers import BertConfig, BertModel

    convert, finetune, *_ = conversion_commands(repo_root)
    bert = tmp_path / "tiny-bert"
    BertModel(
        BertConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=37,
            max_position_embeddings=32,
        )
    ).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    monkeypatch.chdir(repo_root)  # the commands name their files relative to the repository

    def run(command, *overrides):  # in this process, as the interpreter runs the script (tests/in_process.py)
        words = shlex.split(command.split("&&", 1)[-1])
        assert words[0] == "python" and words[1].startswith("scripts/")
        process = run_in_process([*words, *overrides])
        assert process.returncode == 0, process.stderr[-3000:]

    converted = tmp_path / "converted"
    run(
        convert,
        "--model_name_or_path",
        str(bert),
        "--output_dir",
        str(converted),
        "--max_position_embeddings",
        "128",
        "--max_steps",
        "2",
        "--end_to_end_steps",
        "1",
        "--max_seq_length",
        "16",
        "--max_eval_samples",
        "4",
    )
    settings = json.loads((converted / "conversion.json").read_text())
    assert settings["distill_file"] == "data/distillation/train.jsonl.gz"
    assert "base_model: sentence-transformers/all-MiniLM-L6-v2" in (converted / "README.md").read_text()
    output = tmp_path / "finetuned"
    run(
        finetune,
        "--model_name_or_path",
        str(converted),
        "--output_dir",
        str(output),
        "--max_train_samples",
        "32",
        "--max_eval_samples",
        "16",
        "--max_steps",
        "2",
    )
    assert "eval_accuracy" in json.loads((output / "eval_results.json").read_text())


@pytest.mark.slow
def test_classifier_conversion_recipe_runs(repo_root, tmp_path, tokenizer, monkeypatch):
    """The README's commands for a fine-tuned classifier as written, on a tiny BERT and cut short: its fine-tuning
    (the teacher), the distillation texts put together by the shell, then its conversion with the head, distilled
    from its logits; each script run in this process, the texts written to tmp_path instead of runs/."""
    from transformers import BertConfig, BertModel

    *_, teach, (texts, convert) = map(str.splitlines, conversion_commands(repo_root))
    teach, distill = teach[0], tmp_path / "distill.jsonl"
    texts, convert = (line.replace("runs/20newsgroups-distill.jsonl", str(distill)) for line in (texts, convert))
    bert = tmp_path / "tiny-bert"
    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    BertModel(BertConfig(vocab_size=len(tokenizer), max_position_embeddings=64, **sizes)).save_pretrained(bert)
    tokenizer.save_pretrained(bert)
    monkeypatch.chdir(repo_root)

    def run(command, *overrides):
        words = shlex.split(command)
        assert words[0] == "python" and words[1].startswith("scripts/")
        process = run_in_process([*words, *overrides])
        assert process.returncode == 0, process.stderr[-3000:]

    teacher, converted = tmp_path / "teacher", tmp_path / "converted"
    short = ["--max_train_samples", "32", "--max_eval_samples", "16", "--max_steps", "2", "--max_seq_length", "16"]
    run(teach, "--model_name_or_path", str(bert), "--output_dir", str(teacher), *short)
    subprocess.run(["bash", "-c", texts], check=True)
    assert len(distill.read_text().splitlines()) == 2400 + 6924  # the 20 Newsgroups split, data/distillation's
    steps = ["--max_steps", "2", "--end_to_end_steps", "1", "--max_seq_length", "16", "--max_eval_samples", "4"]
    run(
        convert,
        "--model_name_or_path",
        str(teacher),
        "--output_dir",
        str(converted),
        "--max_position_embeddings",
        "64",
        *steps,
    )
    saved = json.loads((converted / "config.json").read_text())
    assert saved["architectures"] == ["FastformerForSequenceClassification"] and len(saved["id2label"]) == 20
    assert saved["cls_attention_heads"] == 4  # the teacher's [CLS] attention kept, as the README says
    assert json.loads((converted / "conversion.json").read_text())["distill_file"] == str(distill)
