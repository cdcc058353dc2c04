"""Per-token decoding time and cache size against the number of generated tokens, and ms per token through
generate(): Fastformer vs BART of the same size (docs/DECODING.md describes the models and the method).

    python -m benchmarks.decoding                                # 64..8192 tokens, 3 repeats, 2 threads
    python -m benchmarks.decoding --lengths 64 256 --repeats 2   # a quick check
"""

import statistics
import time
from pathlib import Path

import torch
from transformers import BartConfig, BartForConditionalGeneration
from transformers.cache_utils import Cache, EncoderDecoderCache

from benchmarks import harness
from benchmarks.encoder import median_by
from benchmarks.harness import DOCS, log_log, plt, save_figure, table
from fastformer import FastformerConfig, FastformerForConditionalGeneration

MODELS = ("Fastformer", "BART")
SIZE = {"hidden-size": 256, "heads": 16, "intermediate-size": 1024, "encoder-layers": 2, "decoder-layers": 4}
WINDOW = 16  # steps averaged per length


def cache_nbytes(cache: Cache) -> int:
    """Bytes held by a transformers generation cache: its layers' keys and values or recurrent and convolution states,
    both parts of an `EncoderDecoderCache`."""
    if isinstance(cache, EncoderDecoderCache):
        return cache_nbytes(cache.self_attention_cache) + cache_nbytes(cache.cross_attention_cache)
    tensors = [getattr(layer, name, None) for layer in cache.layers for name in ("keys", "values")]
    for name in ("recurrent_states", "conv_states"):
        tensors += [t for layer in cache.layers for t in getattr(layer, name, {}).values()]
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def parse_args(argv=None):
    parser = harness.arguments(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)], help="generated tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--source-length", type=int, default=512, help="encoder input tokens")
    for flag, default in SIZE.items():
        parser.add_argument(f"--{flag}", type=int, default=default, help="of both models")
    parser.add_argument("--cross-attention", choices=["softmax", "additive"], default="softmax", help="Fastformer's")
    parser.add_argument("--generate-tokens", type=int, default=64, help="new tokens of each timed generate() call")
    parser.add_argument("--output", type=Path, default=DOCS / "decoding.json", help="the record; CSV, figure beside")
    args = parser.parse_args(argv)
    args.lengths = sorted(set(args.lengths))
    if args.lengths[0] < WINDOW:
        parser.error(f"every length must be at least {WINDOW}, the number of steps averaged")
    return args


def build_models(args) -> dict[str, torch.nn.Module]:
    """The two models, the same widths and layer counts, random weights, no dropout, eval mode."""
    positions = max(args.lengths[-1], args.generate_tokens, args.source_length)
    fastformer = dict(hidden_size=args.hidden_size, num_attention_heads=args.heads, hidden_dropout_prob=0.0)
    fastformer.update(num_hidden_layers=args.encoder_layers, num_decoder_layers=args.decoder_layers, share_layers=False)
    fastformer.update(intermediate_size=args.intermediate_size, max_position_embeddings=positions)
    # one parameter set per layer, as BART; decoding starts from [CLS] of the bert-base-uncased vocabulary
    fastformer = FastformerConfig(**fastformer, cross_attention_type=args.cross_attention, decoder_start_token_id=101)
    bart = dict(vocab_size=fastformer.vocab_size, d_model=args.hidden_size, max_position_embeddings=positions)
    bart.update(encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers)
    bart.update(encoder_attention_heads=args.heads, decoder_attention_heads=args.heads)
    bart.update(encoder_ffn_dim=args.intermediate_size, decoder_ffn_dim=args.intermediate_size)
    bart = BartConfig(**bart, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, attn_implementation="sdpa")
    torch.manual_seed(0)
    models = {"Fastformer": FastformerForConditionalGeneration(fastformer), "BART": BartForConditionalGeneration(bart)}
    return {name: model.eval() for name, model in models.items()}


def decode(model, encoder_outputs, lengths, expected_logits) -> dict[int, tuple[float, int]]:
    """Greedy decoding up to the longest length by the model's forward, one token at a time with the cache passed
    back as generate() steps, checked against generate()'s first logits; per length, the mean seconds of the WINDOW
    steps ending there (the forward and the argmax) and the cache bytes after that step."""
    token, cache = torch.tensor([[model.generation_config.decoder_start_token_id]]), None
    seconds, sizes = [], {}
    for generated in range(1, lengths[-1] + 1):
        start = time.perf_counter()
        outputs = model(decoder_input_ids=token, encoder_outputs=encoder_outputs, cache=cache, use_cache=True)
        logits, cache = outputs.logits[:, -1], outputs.cache
        token = logits.argmax(dim=-1, keepdim=True)
        seconds.append(time.perf_counter() - start)
        if generated <= len(expected_logits):
            torch.testing.assert_close(logits, expected_logits[generated - 1])
        if generated in lengths:
            sizes[generated] = cache_nbytes(cache)
    return {n: (statistics.fmean(seconds[n - WINDOW : n]), sizes[n]) for n in lengths}


@torch.no_grad()
def measure(models, source, args) -> tuple[list[dict], dict[str, list[float]]]:
    """Every (repeat, model, length) row of `decode`; then per model and repeat the ms per new token of a whole
    greedy generate() call of --generate-tokens tokens (the encoder pass included); the models' order alternating."""
    greedy = dict(do_sample=False, num_beams=1)
    # generate()'s first 32 logits, which the decoding must give (this also warms the models up)
    check = dict(max_new_tokens=32, output_logits=True, return_dict_in_generate=True)
    expected = {name: model.generate(source, **greedy, **check).logits for name, model in models.items()}
    encoded = {name: model.get_encoder()(source) for name, model in models.items()}
    rows, generate_ms = [], {name: [] for name in models}
    for repeat in range(args.repeats):
        for name in list(models)[:: 1 if repeat % 2 == 0 else -1]:
            for n, (seconds, size) in decode(models[name], encoded[name], args.lengths, expected[name]).items():
                row = dict(model=name, repeat=repeat, generated_tokens=n, ms_per_token=round(1e3 * seconds, 4))
                rows.append(dict(row, cache_bytes=size))
    tokens = dict(max_new_tokens=args.generate_tokens, min_new_tokens=args.generate_tokens)
    for repeat in range(args.repeats):
        for name in list(models)[:: 1 if repeat % 2 == 0 else -1]:
            seconds = harness.seconds_per_call(lambda: models[name].generate(source, **greedy, **tokens), calls=1)
            generate_ms[name].append(round(1e3 * seconds / args.generate_tokens, 4))
    return rows, generate_ms


def medians(rows) -> tuple[dict, dict]:
    """The median ms/token over repeats and the cache MB, by (model, generated tokens)."""
    cache = median_by(rows, "cache_bytes", "model", "generated_tokens")  # the same every repeat
    return median_by(rows, "ms_per_token", "model", "generated_tokens"), {key: b / 2**20 for key, b in cache.items()}


def tables(record) -> str:
    """Per length, the median ms/token and cache MB, BART's over Fastformer's; per model, the growth and generate()."""
    (median, cache), (first, *_, last) = medians(record["rows"]), record["settings"]["lengths"]
    cells = []
    for n in record["settings"]["lengths"]:
        ms, mb = [median[name, n] for name in MODELS], [cache[name, n] for name in MODELS]
        cells.append([n, *[f"{v:.3f}" for v in ms], *[f"{v:.2f}" for v in (ms[1] / ms[0], *mb, mb[1] / mb[0])]])
    header = ["generated tokens", "Fastformer ms/token", "BART ms/token", "BART / Fastformer", "Fastformer cache MB"]
    found = [table([*header, "BART cache MB", "BART / Fastformer"], cells)]
    through = {name: statistics.median(values) for name, values in record["generate_ms_per_token"].items()}
    cells = [[name, f"{median[name, last] / median[name, first]:.2f}", f"{through[name]:.3f}"] for name in MODELS]
    cells.append(["BART / Fastformer", "", f"{through['BART'] / through['Fastformer']:.2f}"])
    generate = f"generate() of {record['settings']['generate_tokens']} tokens: ms/token"
    return "\n\n".join([*found, table(["model", f"ms/token at {last} / at {first}", generate], cells)])


def plot(rows, lengths, path: Path):
    """ms/token and cache MB against generated tokens, log-log."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, values, unit in zip(axes, medians(rows), ("ms per token", "cache MB")):
        lines = {name: [(n, values[name, n]) for n in lengths] for name in MODELS}
        log_log(axis, lines, lengths, "generated tokens", unit, unit)
    axes[0].legend()
    save_figure(figure, path)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    models = build_models(args)
    start = time.perf_counter()
    source = torch.randint(1000, models["Fastformer"].config.vocab_size, (1, args.source_length))
    rows, generate_ms = measure(models, source, args)
    minutes = round((time.perf_counter() - start) / 60, 1)
    parameters = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    extra = dict(minutes=minutes, parameters=parameters, generate_ms_per_token=generate_ms)
    record = harness.write_record(args.output, rows, args, **extra)
    print(tables(record))
    plot(rows, args.lengths, args.output.with_suffix(".png"))


if __name__ == "__main__":
    main()
