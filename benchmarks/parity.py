"""Numerical parity of the fast paths with the paper's equations.

For `additive_attention` (the encoder) and `causal_additive_attention` (the decoder):
1. float64 vs the plain float64 loops of `fastformer.naive` (small sizes: the loops are slow);
2. each dtype (and CUDA when present) vs float64, at a realistic size with left padding.
For the models:
3. FastformerModel (the paper's default config) in each dtype vs the same weights in float64;
4. FastformerForConditionalGeneration, float32: token-by-token decoding with the cache vs one full forward.

Prints a markdown table. Usage: python -m benchmarks.parity [--seq-len 4096]
"""

import copy

import torch

from benchmarks.harness import arguments, table
from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerModel, naive
from fastformer.functional import additive_attention, causal_additive_attention

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
FUNCTIONS = {
    "additive_attention": (lambda *a: additive_attention(*a).output, naive.additive_attention),
    "causal_additive_attention": (lambda *a: causal_additive_attention(*a)[0], naive.causal_additive_attention),
}


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


def function_rows(seq_len, devices):
    for name, (function, reference) in FUNCTIONS.items():
        tensors, mask = random_inputs(2, 4, 64, 16)
        error = errors(function(*tensors, mask), reference(*tensors, mask), mask)
        yield name, "cpu", torch.float64, "loop reference", 64, *error
        tensors, mask = random_inputs(2, 16, seq_len, 16)
        expected = function(*tensors, mask)
        for device in devices:
            for dtype in DTYPES:
                result = function(*[t.to(device=device, dtype=dtype) for t in tensors], mask.to(device))
                yield name, device, dtype, "float64", seq_len, *errors(result, expected, mask)


@torch.no_grad()
def model_rows(seq_len, devices):
    torch.manual_seed(0)
    model = FastformerModel(FastformerConfig(max_position_embeddings=seq_len)).eval()
    ids = torch.randint(1, model.config.vocab_size, (2, seq_len))
    _, mask = random_inputs(2, 1, seq_len, 1)
    expected = copy.deepcopy(model).double()(ids, attention_mask=mask).last_hidden_state[:, None]
    for device in devices:
        for dtype in DTYPES:
            cast = copy.deepcopy(model).to(device=device, dtype=dtype)
            result = cast(ids.to(device), attention_mask=mask.to(device)).last_hidden_state[:, None]
            yield "FastformerModel", device, dtype, "float64", seq_len, *errors(result, expected, mask)

    length = 256
    config = FastformerConfig(num_decoder_layers=4, share_layers=False, max_position_embeddings=length)
    model = FastformerForConditionalGeneration(config).eval()
    source, target = torch.randint(1, config.vocab_size, (2, 64)), torch.randint(1, config.vocab_size, (2, length))
    full = model(source, decoder_input_ids=target, use_cache=False).logits
    cache = model.new_cache()
    encoder_outputs = model.get_encoder()(source)
    steps = [
        model(encoder_outputs=encoder_outputs, decoder_input_ids=target[:, t : t + 1], cache=cache).logits
        for t in range(length)
    ]
    mask = torch.ones(2, length, dtype=torch.bool)
    error = errors(torch.cat(steps, 1)[:, None], full[:, None].double(), mask)
    yield "seq2seq decoding, token by token", "cpu", torch.float32, "full forward", length, *error


def main():
    parser = arguments(__doc__)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    rows = [[what, device, str(dtype).removeprefix("torch."), reference, length, f"{max_abs:.2e}", f"{relative:.2e}"]
            for what, device, dtype, reference, length, max_abs, relative in
            [*function_rows(args.seq_len, devices), *model_rows(args.seq_len, devices)]]  # fmt: skip
    header = ["what", "device", "dtype", "compared with", "tokens", "max abs error", "relative error (L2)"]
    print("\n".join(table(header, rows)))


if __name__ == "__main__":
    main()
