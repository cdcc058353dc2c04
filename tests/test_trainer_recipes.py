"""Trainer's label smoothing and PEFT's default LoRA targets, with the package imported (which registers both),
against GPT-2 where the recipe is the same; and a checkpoint's Hub code in a fresh interpreter that cannot import
the package, where PEFT needs `target_modules`."""

import json
import textwrap

import pytest
import torch
from torch.nn import functional as F
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from fastformer import FastformerForCausalLM

SMOOTHING = 0.1


def smoothed_next_token_loss(logits, labels):
    """Label-smoothed cross-entropy of position t against token t + 1, as transformers' LabelSmoother computes it
    for a causal LM."""
    vocab = logits.shape[-1]
    return F.cross_entropy(logits[:, :-1].reshape(-1, vocab), labels[:, 1:].reshape(-1), label_smoothing=SMOOTHING)


def trainer_loss(model, ids, output_dir):
    args = TrainingArguments(output_dir, label_smoothing_factor=SMOOTHING, use_cpu=True, report_to=[])
    with torch.no_grad():
        return Trainer(model=model, args=args).compute_loss(model, {"input_ids": ids, "labels": ids})


def test_label_smoothing_trains_the_causal_lm_on_the_next_token_as_gpt2(build, tmp_path):
    ids = torch.randint(3, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=61, n_embd=32, n_layer=2, n_head=4)).eval()
    ours = build(FastformerForCausalLM, vocab_size=61)
    for model in (gpt2, ours):
        with torch.no_grad():
            logits = model(ids).logits
        expected = smoothed_next_token_loss(logits, ids)
        vocab = logits.shape[-1]
        unshifted = F.cross_entropy(logits.reshape(-1, vocab), ids.reshape(-1), label_smoothing=SMOOTHING)
        loss = trainer_loss(model, ids, tmp_path)
        torch.testing.assert_close(loss, expected)
        assert not torch.allclose(loss, unshifted)


HUB_CODE_SCRIPT = textwrap.dedent(
    """
    import json

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("causal_lm", trust_remote_code=True).eval()
    ids = torch.load("ids.pt")
    with torch.no_grad():
        logits = model(ids).logits
    try:
        get_peft_model(model, LoraConfig(task_type="CAUSAL_LM"))
        refused = None
    except ValueError as error:
        refused = str(error)
    lora = get_peft_model(model, LoraConfig(task_type="CAUSAL_LM", target_modules=["query", "value"]))
    print(json.dumps({
        "module": type(model).__module__, "logits": logits.tolist(), "refused": refused,
        "lora_targets": sorted(lora.peft_config["default"].target_modules),
    }))
    """
)


@pytest.mark.slow
def test_hub_code_runs_without_the_package_and_peft_asks_for_its_targets(
    build, tmp_path, hide_fastformer, fresh_python
):
    """Registration happens in `import fastformer` only (README, Hugging Face stack): without the package, PEFT asks
    for `target_modules`, as for any model type it does not know."""
    model = build(FastformerForCausalLM, vocab_size=61)
    model.save_pretrained(tmp_path / "causal_lm")
    ids = torch.randint(3, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    result = json.loads(fresh_python(hide_fastformer + HUB_CODE_SCRIPT, tmp_path).strip().splitlines()[-1])
    assert result["module"].startswith("transformers_modules.")  # built from the code the checkpoint carries
    with torch.no_grad():
        torch.testing.assert_close(torch.tensor(result["logits"]), model(ids).logits)
    assert "target_modules" in result["refused"]
    assert result["lora_targets"] == ["query", "value"]
