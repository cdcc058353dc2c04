"""Fastformer encoder heads as `torch.export` programs and ONNX files (`torch.onnx.export(dynamo=True)`), with dynamic
batch and sequence axes. A graph holds one attention mode (`set_additive_attention_mode`)."""

from contextlib import contextmanager
from pathlib import Path

import torch

from .modeling_fastformer import FastformerLayer, FastformerPreTrainedModel

INPUT_NAMES = ("input_ids", "attention_mask")
# a head's outputs, by the ModelOutput field names that transformers' pipelines read
OUTPUT_NAMES = {
    "FastformerModel": ("last_hidden_state", "pooler_output"),
    "FastformerForSequenceClassification": ("logits",),
    "FastformerForMaskedLM": ("logits",),
}
EXAMPLE_SHAPE = (2, 16)  # the example inputs traced; every other batch size and length runs too


def exported_attention_mode(model) -> str:
    """The attention mode a graph of `model` holds: its encoder layers'; "auto" as the least arithmetic from
    hidden_size / 2 tokens on ("collapsed" for the "product" interaction, else "plain"). Mixed modes are refused."""
    modes = {module.attention_mode for module in model.modules() if isinstance(module, FastformerLayer)}
    if len(modes) > 1:
        raise ValueError(
            f"the encoder layers have different attention modes {sorted(modes)}; pass the graph's attention_mode, "
            "or set one with model.set_additive_attention_mode"
        )
    if modes and modes != {"auto"}:
        return modes.pop()
    return "collapsed" if model.config.interaction == "product" else "plain"


@contextmanager
def using_attention_mode(model, mode: str):
    """`model.set_additive_attention_mode(mode)` for the duration, then every encoder layer's mode restored."""
    saved = {module: module.attention_mode for module in model.modules() if isinstance(module, FastformerLayer)}
    model.set_additive_attention_mode(mode)
    try:
        yield
    finally:
        for module, saved_mode in saved.items():
            module.attention_mode = saved_mode


def example_inputs(model) -> tuple[torch.Tensor, torch.Tensor]:
    """The (input_ids, attention_mask) an export traces, one row half padding; refuses a model in training mode."""
    if model.training:
        raise ValueError("Call model.eval() before exporting: a graph traced in training mode keeps its dropout")
    input_ids = torch.randint(model.config.vocab_size, EXAMPLE_SHAPE, generator=torch.Generator().manual_seed(0))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, EXAMPLE_SHAPE[1] // 2 :] = 0
    return input_ids, attention_mask


def export_program(model: FastformerPreTrainedModel, attention_mode: str | None = None) -> torch.export.ExportedProgram:
    """`model` (an encoder head of OUTPUT_NAMES, in eval mode) as a `torch.export` program of (input_ids,
    attention_mask) for any batch and length, in `attention_mode` (default: `exported_attention_mode`)."""
    name = type(model).__name__
    if name not in OUTPUT_NAMES:
        seq2seq = "; export the encoder-decoder with scripts/export_seq2seq_onnx.py"
        raise ValueError(
            f"export_program takes the encoder heads ({', '.join(OUTPUT_NAMES)}), got {name}"
            + (seq2seq if model.config.is_encoder_decoder else "")
        )
    config = model.config
    input_ids, attention_mask = example_inputs(model)
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", max=config.max_position_embeddings)
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    with using_attention_mode(model, attention_mode or exported_attention_mode(model)), torch.no_grad():
        return torch.export.export(
            model, (), {"input_ids": input_ids, "attention_mask": attention_mask}, dynamic_shapes=dynamic
        )


def export_onnx(model: FastformerPreTrainedModel, path: str | Path, attention_mode: str | None = None) -> Path:
    """Writes `export_program(model)` to the ONNX file `path` and returns it, outputs named as OUTPUT_NAMES."""
    path = Path(path)
    program = export_program(model, attention_mode)
    onnx_program = torch.onnx.export(
        program,
        input_names=list(INPUT_NAMES),
        output_names=list(OUTPUT_NAMES[type(model).__name__]),
        dynamo=True,
        verbose=False,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx_program.save(str(path))
    return path


def quantize_int8(source: Path, destination: Path) -> Path:
    """ONNX Runtime's dynamic quantization of `source` (int8 weights), written to `destination`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415  (the [onnx] extra)

    quantize_dynamic(source, destination, weight_type=QuantType.QInt8)
    return destination
