"""Numerical parity of fastformer.functional.additive_attention with the paper's equations.

1. float64 vs the plain float64 loop reference of tests/test_functional.py (small sizes: the loop is slow);
2. each dtype (and CUDA when present) vs float64, at a realistic size with left padding;
3. the whole encoder (FastformerModel, the paper's default config) in each dtype vs the same weights in float64.

Prints a markdown table. Usage: python benchmarks/parity.py [--seq-len 4096]
"""

import argparse
import copy
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_functional import reference_additive_attention  # noqa: E402

from fastformer import FastformerConfig, FastformerModel  # noqa: E402
from fastformer.functional import additive_attention  # noqa: E402

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def random_inputs(batch, heads, length, head_dim, seed=0):
    generator = torch.Generator().manual_seed(seed)
    shape = (batch, heads, length, head_dim)
    tensors = [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3)]
    tensors += [torch.randn(heads, head_dim, generator=generator, dtype=torch.float64) for _ in range(2)]
    mask = torch.ones(batch, length, dtype=torch.bool)
    mask[0, : length // 3] = False  # left padding
    return tensors, mask


def errors(result, expected, mask):
    real = mask[:, None, :, None].expand_as(expected)
    diff = (result.double().cpu() - expected)[real]
    return diff.abs().max().item(), (diff.norm() / expected[real].norm()).item()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()

    rows = []
    tensors, mask = random_inputs(2, 4, 64, 16)
    result = additive_attention(*tensors, mask)
    reference = reference_additive_attention(*tensors, mask)
    rows.append(("cpu", torch.float64, "loop reference", 64, *errors(result, reference, mask)))

    tensors, mask = random_inputs(2, 16, args.seq_len, 16)
    expected = additive_attention(*tensors, mask)
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        for dtype in DTYPES:
            cast = [t.to(device=device, dtype=dtype) for t in tensors]
            result = additive_attention(*cast, mask.to(device))
            rows.append((device, dtype, "float64", args.seq_len, *errors(result, expected, mask)))

    torch.manual_seed(0)
    model = FastformerModel(FastformerConfig(max_position_embeddings=args.seq_len)).eval()
    ids = torch.randint(1, model.config.vocab_size, (2, args.seq_len))
    with torch.no_grad():
        expected = copy.deepcopy(model).double()(ids, attention_mask=mask).last_hidden_state[:, None]
        for device in devices:
            for dtype in DTYPES:
                cast = copy.deepcopy(model).to(device=device, dtype=dtype)
                result = cast(ids.to(device), attention_mask=mask.to(device)).last_hidden_state[:, None]
                rows.append((device, dtype, "float64 encoder", args.seq_len, *errors(result, expected, mask)))

    print("| device | dtype | compared with | tokens | max abs error | relative error (L2) |")
    print("|---|---|---|---|---|---|")
    for device, dtype, reference, length, max_abs, relative in rows:
        dtype = str(dtype).removeprefix("torch.")
        print(f"| {device} | {dtype} | {reference} | {length} | {max_abs:.2e} | {relative:.2e} |")


if __name__ == "__main__":
    main()
