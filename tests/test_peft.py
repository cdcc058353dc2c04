"""PEFT: LoRA on a Fastformer as on BERT (default targets, Trainer fine-tuning, adapter save and reload)."""

import json

import datasets
import pytest
import torch
from peft import LoraConfig, PeftModel, TaskType, get_peft_model
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from fastformer import FastformerForConditionalGeneration, FastformerForSequenceClassification


def lora_modules(model) -> set[str]:
    return {name.rsplit(".", 1)[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}


def test_lora_without_target_modules_adapts_the_attention_as_for_bert(build):
    bert_config = BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, num_labels=3
    )
    bert = BertForSequenceClassification(bert_config)
    assert lora_modules(get_peft_model(bert, LoraConfig(task_type=TaskType.SEQ_CLS))) == {"query", "value"}
    paper = build(FastformerForSequenceClassification)  # query-value sharing: the values are the queries
    assert lora_modules(get_peft_model(paper, LoraConfig(task_type=TaskType.SEQ_CLS))) == {"query"}
    unshared = build(FastformerForSequenceClassification, share_query_value=False)
    assert lora_modules(get_peft_model(unshared, LoraConfig(task_type=TaskType.SEQ_CLS))) == {"query", "value"}
    seq2seq = get_peft_model(build(FastformerForConditionalGeneration), LoraConfig(task_type=TaskType.SEQ_2_SEQ_LM))
    adapted = {name for name, module in seq2seq.named_modules() if hasattr(module, "lora_A")}
    assert any(".cross_attention.value" in name for name in adapted)


def test_lora_fine_tune_with_trainer_then_reload_the_adapter_on_the_base(build, tmp_path):
    base = build(FastformerForSequenceClassification, share_query_value=False)
    base.save_pretrained(tmp_path / "base")
    frozen = {name: p.clone() for name, p in base.named_parameters()}
    model = get_peft_model(base, LoraConfig(task_type=TaskType.SEQ_CLS, r=4, lora_alpha=8))
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 99, (32, 12), generator=generator)
    labels = (ids[:, 0] % 3).tolist()  # learnable from the first token
    train = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": labels})
    args = TrainingArguments(
        tmp_path / "run",
        use_cpu=True,
        per_device_train_batch_size=8,
        num_train_epochs=3,
        learning_rate=5e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert losses[-1] < losses[0]
    for name, parameter in model.base_model.model.named_parameters():
        if "lora_" not in name and "modules_to_save" not in name and name in frozen:
            assert torch.equal(parameter, frozen[name]), name  # LoRA leaves the base weights as they were
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()

    model.eval()
    with torch.no_grad():
        expected = model(input_ids=ids[:4]).logits
        reloaded = PeftModel.from_pretrained(
            FastformerForSequenceClassification.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
        ).eval()
        torch.testing.assert_close(reloaded(input_ids=ids[:4]).logits, expected)
        plain = FastformerForSequenceClassification.from_pretrained(tmp_path / "base").eval()
        assert not torch.allclose(plain(input_ids=ids[:4]).logits, expected)  # the adapter changes the model


def test_lora_changes_the_output_on_every_attention_path(build):
    """The collapsed attention folds the Linear weights (it would skip an adapter): "auto" takes the plain path
    under PEFT, and an explicit "collapsed" refuses."""
    base = build(FastformerForSequenceClassification, share_query_value=False)
    ids = torch.randint(1, 99, (2, 24))  # long enough for "auto" to collapse a plain model (hidden 32)
    with torch.no_grad():
        plain = base(input_ids=ids).logits
        model = get_peft_model(base, LoraConfig(task_type=TaskType.SEQ_CLS, init_lora_weights=False))
        with model.disable_adapter():
            torch.testing.assert_close(model(input_ids=ids).logits, plain)
        assert not torch.allclose(model(input_ids=ids).logits, plain, atol=1e-4)  # the adapter acts
        base.set_additive_attention_mode("collapsed")
        with pytest.raises(ValueError, match="some are wrapped .e.g. by a PEFT adapter"):
            model(input_ids=ids)


IMPORT_SCRIPT = """
import json

from peft.utils import constants


def tables():
    return {name: dict(table) for name, table in vars(constants).items() if name.endswith("_TARGET_MODULES_MAPPING")}


before = tables()
import fastformer

imported = tables()
fastformer.FastformerModel(fastformer.FastformerConfig(hidden_size=32, num_attention_heads=4))
created = tables()
print(json.dumps({
    "before": "fastformer" in before["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"],
    "imported": imported["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"].get("fastformer"),
    "unchanged_by_a_model": created == imported,
}))
"""


@pytest.mark.slow
def test_importing_the_package_registers_peft_defaults_and_a_model_changes_nothing(fresh_python, tmp_path):
    result = json.loads(fresh_python(IMPORT_SCRIPT, tmp_path).strip().splitlines()[-1])
    assert result == {"before": False, "imported": ["query", "value"], "unchanged_by_a_model": True}
