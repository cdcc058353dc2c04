"""No lost work: an interrupted Trainer run resumes to the same weights, weights are saved as safetensors only,
and a damaged or mismatched checkpoint fails loudly on load instead of giving random or wrong weights; a valid
file that another tool rewrote loads.
(Publishing to an existing Hub repo adds a commit and keeps the other files: tests/test_hub.py.)"""

import functools
import json
import shutil

import datasets
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, Trainer, TrainerCallback, TrainingArguments

from fastformer import FastformerForSequenceClassification, FastformerModel
from fastformer.cli import check_weights_readable
from training_utils import ModelArguments, load_model

VOCAB = 99


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    # dropout on (0.2, FastformerConfig's default): resuming must restore its random state too
    return functools.partial(tiny_config, vocab_size=VOCAB, hidden_dropout_prob=0.2)


def classification_data():
    generator = torch.Generator().manual_seed(0)
    return datasets.Dataset.from_dict(
        {
            "input_ids": torch.randint(1, VOCAB, (48, 24), generator=generator).tolist(),
            "labels": torch.randint(0, 3, (48,), generator=generator).tolist(),
        }
    )


class Interrupt(TrainerCallback):
    """Raises at the start of step `at` (after the checkpoint of step at - 1 was written), as a crash would."""

    def __init__(self, at):
        self.at = at

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.at - 1:
            raise KeyboardInterrupt(f"interrupted before step {self.at}")


def train(build, output_dir, callbacks=(), resume=None):
    model = build(FastformerForSequenceClassification).train()  # the same initial weights every time
    args = TrainingArguments(
        output_dir,
        use_cpu=True,
        per_device_train_batch_size=8,
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
        learning_rate=1e-3,
        report_to="none",
        seed=0,
        disable_tqdm=True,
        logging_steps=1,
    )
    trainer = Trainer(model=model, args=args, train_dataset=classification_data(), callbacks=list(callbacks))
    trainer.train(resume_from_checkpoint=resume)
    return model


def test_interrupted_training_resumes_to_the_same_weights(build, tmp_path):
    uninterrupted = train(build, tmp_path / "whole")
    with pytest.raises(KeyboardInterrupt):
        train(build, tmp_path / "interrupted", callbacks=[Interrupt(at=5)])
    assert sorted(p.name for p in (tmp_path / "interrupted").glob("checkpoint-*")) == ["checkpoint-3"]
    resumed = train(build, tmp_path / "interrupted", resume=True)  # a fresh model and Trainer, as after a restart
    state = json.loads((tmp_path / "interrupted" / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    for (name, expected), actual in zip(uninterrupted.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(actual, expected), name
    start = build(FastformerForSequenceClassification)  # the initial weights every run above started from
    assert not torch.equal(start.classifier.weight, resumed.classifier.weight)  # training moved them


def test_weights_are_saved_as_safetensors_only_as_transformers_saves_them(build, tmp_path):
    model = build(FastformerModel)
    model.save_pretrained(tmp_path)
    weights = {path.name for path in tmp_path.iterdir() if path.suffix not in (".py", ".json")}
    assert weights == {"model.safetensors"}
    assert {path.name for path in tmp_path.glob("*.json")} == {"config.json"}  # no sidecar of ours
    model.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert len(list((tmp_path / "sharded").glob("*.safetensors"))) > 1
    loaded = FastformerModel.from_pretrained(tmp_path / "sharded")
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


@pytest.fixture
def saved(build, tmp_path):
    build(FastformerModel).save_pretrained(tmp_path / "saved")
    return tmp_path / "saved"


def damage(folder, how):
    weights = folder / "model.safetensors"
    data = bytearray(weights.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "header":
        data[10:20] = b"\xff" * 10
    elif how == "garbage":
        data = bytearray(b"not a safetensors file\n" * 100)
    weights.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncated", "header", "garbage"])
@pytest.mark.parametrize("loader", [FastformerModel, AutoModel], ids=["class", "auto"])
def test_damaged_weights_fail_loudly(saved, how, loader):
    damage(saved, how)
    with pytest.raises(Exception, match="Error while deserializing header"):  # safetensors' own check
        loader.from_pretrained(saved)


@pytest.mark.parametrize("how", ["truncated", "header", "garbage"])
def test_the_scripts_name_the_damaged_file(saved, how, capsys):
    """What the training scripts and the converter check before they load a model or resume from a checkpoint."""
    check_weights_readable(saved)
    damage(saved, how)
    with pytest.raises(SystemExit, match=rf"{saved / 'model.safetensors'} is damaged \(truncated or overwritten"):
        check_weights_readable(saved)


def test_weights_rewritten_by_another_tool_load(saved):
    """A valid file written again by safetensors itself (a merge, a quantization tool, a conversion script)."""
    state = load_file(saved / "model.safetensors")
    state = {name: tensor + 1 for name, tensor in state.items()}
    save_file(state, saved / "model.safetensors", metadata={"format": "pt"})
    loaded = FastformerModel.from_pretrained(saved)
    assert torch.equal(loaded.embeddings.word_embeddings.weight, state["embeddings.word_embeddings.weight"])


def test_missing_weights_file_fails_loudly(saved):
    (saved / "model.safetensors").unlink()
    with pytest.raises(OSError, match="no file named model.safetensors"):
        FastformerModel.from_pretrained(saved)


def test_config_of_another_shape_fails_loudly(saved, tmp_path):
    mismatched = tmp_path / "mismatched"
    shutil.copytree(saved, mismatched)
    settings = json.loads((mismatched / "config.json").read_text())
    (mismatched / "config.json").write_text(json.dumps({**settings, "intermediate_size": 40}))
    with pytest.raises(RuntimeError, match="ignore_mismatched_sizes"):
        FastformerModel.from_pretrained(mismatched)


def test_the_scripts_loader_names_a_damaged_checkpoint_before_loading(saved):
    damage(saved, "truncated")
    model_args = ModelArguments(model_name_or_path=str(saved))
    with pytest.raises(SystemExit, match=rf"{saved / 'model.safetensors'} is damaged"):
        load_model(AutoModel, model_args, FastformerModel.config_class.from_pretrained(saved))
