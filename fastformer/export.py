"""Fastformer encoders as graphs for deployment: `torch.export` programs and ONNX files, with dynamic batch and
sequence axes.

The ONNX route is `torch.onnx.export(..., dynamo=True)` over the `torch.export` program: optimum-onnx, the
ecosystem's exporter, does not install beside transformers 5 (its newest release, 0.1.0, requires
transformers < 4.58), so an `OnnxConfig` for it could not be tested here.

The encoder layers' attention sub-layer has two exact implementations (`config.attention_implementation`); a
graph holds one. "auto" chooses by the sequence length at every call, which a graph with a dynamic length cannot
do, so it is exported as the implementation "auto" takes for all but the shortest inputs: "collapsed" for the
"product" interaction (sequences of at least hidden_size / 2 tokens), "plain" otherwise.
"""

from contextlib import contextmanager
from pathlib import Path

import torch

from .modeling_fastformer import FastformerPreTrainedModel

INPUT_NAMES = ("input_ids", "attention_mask")
# a head's outputs, by the ModelOutput field names that transformers' pipelines read
OUTPUT_NAMES = {
    "FastformerModel": ("last_hidden_state", "pooler_output"),
    "FastformerForSequenceClassification": ("logits",),
    "FastformerForMaskedLM": ("logits",),
}
EXAMPLE_SHAPE = (2, 16)  # the example inputs traced; every other batch size and length runs too


def exported_implementation(config) -> str:
    """The attention implementation a graph holds: the config's, with "auto" resolved as the module docstring says."""
    if config.attention_implementation != "auto":
        return config.attention_implementation
    return "collapsed" if config.interaction == "product" else "plain"


@contextmanager
def attention_implementation(model, implementation: str):
    """`model.config.attention_implementation` set to `implementation` for the duration, then restored."""
    saved = model.config.attention_implementation
    model.config.attention_implementation = implementation
    try:
        yield
    finally:
        model.config.attention_implementation = saved


def export_program(model: FastformerPreTrainedModel, implementation: str | None = None) -> torch.export.ExportedProgram:
    """`model` (an encoder head of OUTPUT_NAMES, in eval mode) as a `torch.export` program of
    (input_ids, attention_mask) -> its outputs, for any batch size and any length up to
    `max_position_embeddings`. `implementation`: the attention implementation (default: `exported_implementation`).
    """
    name = type(model).__name__
    if name not in OUTPUT_NAMES:
        raise ValueError(f"Exporting {name} is not supported: the encoder heads are {', '.join(OUTPUT_NAMES)}")
    if model.training:
        raise ValueError("Call model.eval() before exporting: a graph traced in training mode keeps its dropout")
    config = model.config
    batch = torch.export.Dim("batch")
    sequence = torch.export.Dim("sequence", max=config.max_position_embeddings)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(config.vocab_size, EXAMPLE_SHAPE, generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, EXAMPLE_SHAPE[1] // 2 :] = 0  # a padded row, so that the mask is traced as data
    dynamic = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    with attention_implementation(model, implementation or exported_implementation(config)), torch.no_grad():
        return torch.export.export(
            model, (), {"input_ids": input_ids, "attention_mask": attention_mask}, dynamic_shapes=dynamic
        )


def export_onnx(model: FastformerPreTrainedModel, path: str | Path, implementation: str | None = None) -> Path:
    """Writes `model` (see `export_program`) to the ONNX file `path`: inputs `input_ids` and `attention_mask`
    (int64, (batch, sequence)), outputs named as the head's ModelOutput fields (OUTPUT_NAMES). Returns the path."""
    path = Path(path)
    program = export_program(model, implementation)
    onnx_program = torch.onnx.export(
        program, input_names=list(INPUT_NAMES), output_names=list(OUTPUT_NAMES[type(model).__name__]), dynamo=True,
        verbose=False,
    )  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx_program.save(str(path))
    return path
