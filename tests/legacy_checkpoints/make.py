"""Writes the tiny checkpoints of every head beside this file, with their outputs (`expected.safetensors`).

Run once, at the commit named in README.md here, by the code that saved checkpoints before the model family's
redesign: `python -m tests.legacy_checkpoints.make`. The tests load them with the code as it is now."""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

import fastformer  # noqa: F401  (registers the classes, which then save their code beside the weights)
from fastformer import (
    FastformerConfig,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)

HERE = Path(__file__).parent
TINY = dict(
    vocab_size=64,
    hidden_size=16,
    num_attention_heads=2,
    intermediate_size=32,
    num_hidden_layers=2,
    max_position_embeddings=64,
    pad_token_id=0,
    hidden_dropout_prob=0.1,
    initializer_range=0.3,
)
GENERATION = dict(bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
CHECKPOINTS = {
    "encoder": (FastformerModel, dict()),
    "classifier": (FastformerForSequenceClassification, dict(num_labels=3, share_layers=False, interaction="concat")),
    "masked_lm": (FastformerForMaskedLM, dict(embedding_size=8, pooler_type="cls")),
    "seq2seq": (FastformerForConditionalGeneration, dict(num_decoder_layers=3, **GENERATION)),
    "seq2seq_additive": (
        FastformerForConditionalGeneration,
        dict(cross_attention_type="additive", share_layers=False, share_query_value=False, **GENERATION),
    ),
    "seq2seq_copy": (
        FastformerForConditionalGeneration,
        dict(
            copy_mechanism=True,
            copy_spans=True,
            copy_context_window=3,
            decoder_conv_kernel=4,
            tie_encoder_embeddings=False,
            **GENERATION,
        ),
    ),
    "causal_lm": (FastformerForCausalLM, dict(decoder_conv_kernel=3, share_layers=False, **GENERATION)),
}
# with their Hub code (`trust_remote_code`; the classifier's config names it, the test copies it in); the others keep
# the weights and the config only
WITH_CODE = {"classifier", "seq2seq_copy"}

INPUT_IDS = torch.tensor([[5, 9, 13, 17, 21, 25, 29], [0, 0, 7, 11, 15, 19, 23]])  # the second row left-padded
ATTENTION_MASK = (INPUT_IDS != 0).long()
DECODER_IDS = torch.tensor([[1, 6, 10, 14], [1, 8, 12, 16]])


def outputs(name, model) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        if name == "encoder":
            out = model(INPUT_IDS, attention_mask=ATTENTION_MASK)
            return {"last_hidden_state": out.last_hidden_state, "pooler_output": out.pooler_output}
        if name.startswith("seq2seq"):
            out = model(INPUT_IDS, attention_mask=ATTENTION_MASK, decoder_input_ids=DECODER_IDS)
            greedy = model.generate(INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6, do_sample=False)
            beams = model.generate(
                INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6, num_beams=3, do_sample=False
            )
            return {"logits": out.logits, "greedy": greedy, "beams": beams}
        out = model(INPUT_IDS, attention_mask=ATTENTION_MASK)
        result = {"logits": out.logits}
        if name == "causal_lm":
            result["greedy"] = model.generate(INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6)
            result["beams"] = model.generate(INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6, num_beams=3)
        return result


def main():
    for name, (model_class, fields) in CHECKPOINTS.items():
        torch.manual_seed(0)
        model = model_class(FastformerConfig(**TINY, **fields)).eval()
        folder = HERE / name
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        if name not in WITH_CODE:
            for code in folder.glob("*.py"):
                code.unlink()
            config = json.loads((folder / "config.json").read_text())
            config.pop("auto_map", None)
            config.pop("custom_pipelines", None)
            (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        tensors = {key: value.contiguous() for key, value in outputs(name, model).items()}
        save_file(tensors, folder / "expected.safetensors")


if __name__ == "__main__":
    main()
