"""Numerical parity of the fast paths with the paper's equations in float64 (docs/PARITY.md).

python -m benchmarks.parity                               # 4096 tokens -> docs/parity.json
python -m benchmarks.parity --seq-len 64 --decode-tokens 16
"""

import copy
from pathlib import Path

import torch

from benchmarks import harness
from benchmarks.harness import DOCS, table
from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerModel, naive
from fastformer.functional import additive_attention, causal_additive_attention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUNCTIONS = {
    "additive_attention": (lambda *a: additive_attention(*a).output, naive.additive_attention),
    "causal_additive_attention": (lambda *a: causal_additive_attention(*a)[0], naive.causal_additive_attention),
}


def random_inputs(heads, length, head_dim):
    """Query, key, value (2, H, N, D) and the two pooling vectors (H, D) in float64, and a mask (2, N) whose first
    sequence is one-third left padding."""
    generator = torch.Generator().manual_seed(0)
    tensors = [torch.randn(2, heads, length, head_dim, generator=generator, dtype=torch.float64) for _ in "qkv"]
    tensors += [torch.randn(heads, head_dim, generator=generator, dtype=torch.float64) for _ in range(2)]
    mask = torch.ones(2, length, dtype=torch.bool)
    mask[0, : length // 3] = False
    return tensors, mask


@torch.no_grad()
def comparisons(seq_len, decode_tokens, devices):
    """(what, device, dtype, compared with, result, expected (B, H, N, D), mask) of each comparison (docs/PARITY.md)."""
    for name, (function, reference) in FUNCTIONS.items():
        tensors, mask = random_inputs(4, 64, 16)
        expected = reference(*tensors, mask)
        yield name, "cpu", torch.float64, "loop reference", function(*tensors, mask), expected, mask
        tensors, mask = random_inputs(16, seq_len, 16)
        expected = function(*tensors, mask)
        for device, dtype in [(device, dtype) for device in devices for dtype in DTYPES]:
            result = function(*[t.to(device=device, dtype=dtype) for t in tensors], mask.to(device))
            yield name, device, dtype, "float64", result, expected, mask
    torch.manual_seed(0)
    model = FastformerModel(FastformerConfig(max_position_embeddings=seq_len)).eval()
    ids, (_, mask) = torch.randint(1, model.config.vocab_size, (2, seq_len)), random_inputs(1, seq_len, 1)
    expected = copy.deepcopy(model).double()(ids, attention_mask=mask).last_hidden_state[:, None]
    for device, dtype in [(device, dtype) for device in devices for dtype in DTYPES]:
        cast = copy.deepcopy(model).to(device=device, dtype=dtype)
        result = cast(ids.to(device), attention_mask=mask.to(device)).last_hidden_state[:, None]
        yield "FastformerModel", device, dtype, "float64", result, expected, mask
    config = FastformerConfig(num_decoder_layers=4, share_layers=False, max_position_embeddings=max(64, decode_tokens))
    model = FastformerForConditionalGeneration(config).eval()
    source = torch.randint(1, config.vocab_size, (2, 64))  # 64 source tokens
    target = torch.randint(1, config.vocab_size, (2, decode_tokens))
    full = model(source, decoder_input_ids=target, use_cache=False).logits[:, None].double()
    cache, encoded, steps = None, model.get_encoder()(source), []
    for t in range(decode_tokens):
        step = model(encoder_outputs=encoded, decoder_input_ids=target[:, [t]], cache=cache, use_cache=True)
        steps.append(step.logits)
        cache = step.cache
    result, mask = torch.cat(steps, 1)[:, None], torch.ones(2, decode_tokens, dtype=torch.bool)
    yield "seq2seq decoding, token by token", "cpu", torch.float32, "full forward", result, full, mask


def main(argv=None):
    parser = harness.arguments(__doc__)
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--decode-tokens", type=int, default=256, help="of the decoding row")
    parser.add_argument("--output", type=Path, default=DOCS / "parity.json", help="the record; a CSV beside it")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    devices, rows = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []), []
    found = comparisons(args.seq_len, args.decode_tokens, devices)
    for what, device, dtype, reference, result, expected, mask in found:
        real = mask[:, None, :, None].expand_as(expected)  # errors over real tokens
        difference = (result.double().cpu() - expected)[real]
        row = dict(what=what, device=device, dtype=str(dtype).removeprefix("torch."), compared_with=reference)
        row.update(tokens=mask.shape[1], max_abs_error=difference.abs().max().item())
        rows.append(dict(row, relative_error=(difference.norm() / expected[real].norm()).item()))
    harness.write_record(args.output, rows, args)
    cells = [[*list(row.values())[:5], f"{row['max_abs_error']:.2e}", f"{row['relative_error']:.2e}"] for row in rows]
    header = ["what", "device", "dtype", "compared with", "tokens", "max abs error", "relative error (L2)"]
    print(table(header, cells))


if __name__ == "__main__":
    main()
