"""The README's example runs as written, and CI runs the README's test command."""

import re
import runpy
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text()


def run_example(heading, tmp_path, monkeypatch):
    example = re.search(heading + r"\n\n```python\n(.*?)```", README, re.S).group(1)
    (tmp_path / "data").symlink_to(REPO / "data")
    (tmp_path / "example.py").write_text(example)
    monkeypatch.chdir(tmp_path)
    return runpy.run_path("example.py")


def test_usage_example_runs(tmp_path, monkeypatch):
    namespace = run_example("## Usage", tmp_path, monkeypatch)
    assert namespace["logits"].shape == (2, 2)
    assert (tmp_path / "my-fastformer" / "model.safetensors").exists()
    with torch.no_grad():
        assert torch.equal(namespace["reloaded"].eval()(**namespace["batch"]).logits, namespace["logits"])


def test_generation_example_runs(tmp_path, monkeypatch):
    namespace = run_example("### Generation with a constant-size state", tmp_path, monkeypatch)
    summary_ids = namespace["summary_ids"]
    assert summary_ids.shape[0] == 1 and 1 < summary_ids.shape[1] <= 33
    assert summary_ids[0, 0] == namespace["tokenizer"].cls_token_id


def test_ci_runs_the_readme_test_command():
    command = re.search(r"## Quickstart\n.*?```bash\n(.*?)\n```", README, re.S).group(1)
    assert "pytest" in command
    assert command in (REPO / ".ci" / "run").read_text().splitlines()
