"""Export a Fastformer encoder head to ONNX, with dynamic batch and sequence axes, and check it on ONNX Runtime.

Writes model.onnx (--int8: also model_quantized.onnx), the config, the tokenizer and onnx_check.json, the largest
difference to PyTorch on padded batches of untraced shapes; above --atol the export fails and replaces nothing."""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer

import fastformer  # noqa: F401  (registers Fastformer with the Auto classes)
from fastformer.cli import require_extra
from fastformer.export import EXAMPLE_SHAPE, OUTPUT_NAMES, export_onnx, exported_attention_mode, quantize_int8

# optimum's task names -> the head
TASKS = {
    "feature-extraction": AutoModel,
    "text-classification": AutoModelForSequenceClassification,
    "fill-mask": AutoModelForMaskedLM,
}
HEADS = {
    "FastformerModel": "feature-extraction",
    "FastformerForSequenceClassification": "text-classification",
    "FastformerForMaskedLM": "fill-mask",
}
CHECK_SHAPES = ((3, 7), (2, 2 * EXAMPLE_SHAPE[1] + 3))  # (batch, length), neither traced by the export


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_name_or_path", required=True, help="a Fastformer checkpoint (folder or Hub id)")
    parser.add_argument("--output_dir", type=Path, required=True, help="where model.onnx and the rest are written")
    parser.add_argument("--task", choices=["auto", *TASKS], default="auto", help="the head (default: the checkpoint's)")
    parser.add_argument(
        "--additive_attention_mode",
        choices=["plain", "collapsed"],
        help="default: collapsed for the product interaction, else plain",
    )
    parser.add_argument("--atol", type=float, default=1e-4, help="largest difference to PyTorch accepted")
    parser.add_argument("--int8", action="store_true", help="also write model_quantized.onnx (int8 weights)")
    args = parser.parse_args(argv)
    own_folder = args.output_dir.resolve() == Path(args.model_name_or_path).resolve()
    if own_folder and (args.output_dir / "config.json").exists():
        parser.error("--output_dir is the checkpoint's own folder: its config.json would be overwritten")
    return args


def task_of(config) -> str:
    """The checkpoint's own head (optimum's task name), feature-extraction for any other."""
    return next((HEADS[name] for name in config.architectures or () if name in HEADS), "feature-extraction")


def largest_differences(model, session, output_names) -> dict[str, float]:
    """Per output, the largest |ONNX Runtime - PyTorch| over CHECK_SHAPES, each batch with a padded row."""
    generator = torch.Generator().manual_seed(1)
    found = dict.fromkeys(output_names, 0.0)
    for batch, length in CHECK_SHAPES:
        input_ids = torch.randint(model.config.vocab_size, (batch, length), generator=generator)
        attention_mask = torch.ones_like(input_ids)
        attention_mask[0, length // 2 :] = 0
        with torch.no_grad():
            expected = model(input_ids=input_ids, attention_mask=attention_mask)
        outputs = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
        for name, value in zip(output_names, outputs, strict=True):
            found[name] = max(found[name], float(np.abs(value - expected[name].numpy()).max()))
    return found


def main(argv=None):
    args = parse_args(argv)
    require_extra("fastformer-export-onnx", "onnx")
    import onnxruntime  # noqa: PLC0415  (the [onnx] extra)

    config = AutoConfig.from_pretrained(args.model_name_or_path)
    if config.model_type != "fastformer":
        sys.exit(f"export_onnx.py: error: {args.model_name_or_path} is a {config.model_type!r} model, not Fastformer")
    task = task_of(config) if args.task == "auto" else args.task
    model = TASKS[task].from_pretrained(args.model_name_or_path).eval()
    attention_mode = args.additive_attention_mode or exported_attention_mode(model)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    partial = args.output_dir / "model.onnx.partial"
    output_names = OUTPUT_NAMES[type(model).__name__]
    try:  # a failed export or check leaves the folder as it was
        session = onnxruntime.InferenceSession(
            str(export_onnx(model, partial, attention_mode)), providers=["CPUExecutionProvider"]
        )
        differences = largest_differences(model, session, output_names)
        if max(differences.values()) > args.atol:
            sys.exit(f"export_onnx.py: error: ONNX Runtime differs from PyTorch by {differences} > --atol {args.atol}")
        partial.replace(args.output_dir / "model.onnx")
    finally:
        partial.unlink(missing_ok=True)
    check = {
        "task": task,
        "additive_attention_mode": attention_mode,
        "shapes": CHECK_SHAPES,
        "max_abs_difference": differences,
        "atol": args.atol,
    }
    quantized = args.output_dir / "model_quantized.onnx"
    quantized.unlink(missing_ok=True)  # an earlier export's, of the model.onnx just replaced
    if args.int8:
        quantize_int8(args.output_dir / "model.onnx", quantized)
        session = onnxruntime.InferenceSession(str(quantized), providers=["CPUExecutionProvider"])
        check["int8_max_abs_difference"] = largest_differences(model, session, output_names)
    (args.output_dir / "onnx_check.json").write_text(json.dumps(check, indent=2) + "\n")
    config.save_pretrained(args.output_dir)
    try:
        AutoTokenizer.from_pretrained(args.model_name_or_path).save_pretrained(args.output_dir)
    except (OSError, ValueError):
        print(f"warning: {args.model_name_or_path} has no tokenizer to save beside the model", file=sys.stderr)
    print(
        f"Exported {task} ({attention_mode} attention) to {args.output_dir / 'model.onnx'}; "
        f"largest difference to PyTorch: {max(differences.values()):.2e}"
    )


if __name__ == "__main__":
    main()
