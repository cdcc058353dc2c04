"""Per-token decoding time and cache size against the number of generated tokens: Fastformer vs BART.

Models of the same size, random weights, fp32, batch 1 (the report's header describes them). Each encodes one
random source once; then greedy decoding calls the model's forward one token at a time exactly as generate() does
(last token, the cache passed back), checked against generate()'s logits first. Every repeat decodes up to the
longest length once per model, the models' order alternating; the tables report medians over repeats. Then
generate() itself: whole greedy calls of --generate-tokens new tokens, per token.

Usage (`python -m benchmarks.suite` runs this and the encoder benchmark in one command):
    python -m benchmarks.decoding                                # 64..8192 tokens, 3 repeats, 2 threads
    python -m benchmarks.decoding --lengths 64 256 --repeats 2   # a quick check
    python -m benchmarks.decoding --report                       # docs/DECODING.md from docs/decoding.csv
"""

import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import BartConfig, BartForConditionalGeneration
from transformers.cache_utils import Cache, EncoderDecoderCache

from benchmarks.harness import (
    DOCS,
    arguments,
    csv_report,
    log_log,
    plt,
    report_start,
    save_figure,
    table,
    write_measurements,
)
from fastformer import FastformerCache, FastformerConfig, FastformerForConditionalGeneration

WINDOW = 16  # steps averaged per length
SETTINGS = ("lengths", "repeats", "source_length", "hidden_size", "heads", "intermediate_size", "encoder_layers",
            "decoder_layers", "cross_attention", "generate_tokens")  # fmt: skip


def cache_nbytes(cache: Cache) -> int:
    """Bytes held by a transformers generation cache: its layers' keys and values or recurrent states, a
    `FastformerCache`'s positions, both parts of an `EncoderDecoderCache`."""
    if isinstance(cache, EncoderDecoderCache):
        return cache_nbytes(cache.self_attention_cache) + cache_nbytes(cache.cross_attention_cache)
    tensors = [getattr(layer, name, None) for layer in cache.layers for name in ("keys", "values")]
    tensors += [t for layer in cache.layers for t in getattr(layer, "recurrent_states", {}).values()]
    if isinstance(cache, FastformerCache):
        tensors.append(cache.positions)
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def parse_args(argv=None):
    parser = arguments(__doc__, threads=2, repeats=3, report="only rewrite --markdown from --csv and its .json")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)], help="generated tokens")
    parser.add_argument("--source-length", type=int, default=512, help="encoder input tokens")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--decoder-layers", type=int, default=4)
    parser.add_argument("--cross-attention", choices=["softmax", "additive"], default="softmax", help="Fastformer's")
    parser.add_argument("--generate-tokens", type=int, default=64, help="new tokens of each timed generate() call")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=DOCS / "decoding.csv", help="every measurement")
    parser.add_argument("--markdown", type=Path, default=DOCS / "DECODING.md", help="the report")
    parser.add_argument("--plot", type=Path, default=DOCS / "decoding.png", help="time and cache against tokens")
    args = parser.parse_args(argv)
    args.lengths = sorted(set(args.lengths))
    if args.lengths[0] < WINDOW:
        parser.error(f"every length must be at least {WINDOW}, the number of steps averaged")
    return args


def build_models(args) -> dict[str, transformers.PreTrainedModel]:
    """The two models, same widths and layer counts, random weights, no dropout, eval mode."""
    positions = max(args.lengths[-1], args.generate_tokens, args.source_length)
    fastformer = FastformerConfig(
        hidden_size=args.hidden_size, num_attention_heads=args.heads, intermediate_size=args.intermediate_size,
        num_hidden_layers=args.encoder_layers, num_decoder_layers=args.decoder_layers,
        share_layers=False,  # one parameter set per layer, as BART
        cross_attention_type=args.cross_attention, hidden_dropout_prob=0.0, max_position_embeddings=positions,
        decoder_start_token_id=101,  # [CLS] of the bert-base-uncased vocabulary
    )  # fmt: skip
    bart = BartConfig(
        vocab_size=fastformer.vocab_size, d_model=args.hidden_size, encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads, encoder_ffn_dim=args.intermediate_size,
        decoder_ffn_dim=args.intermediate_size, encoder_layers=args.encoder_layers, decoder_layers=args.decoder_layers,
        max_position_embeddings=positions, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0,
        attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(args.seed)
    return {
        "Fastformer": FastformerForConditionalGeneration(fastformer).eval(),
        "BART": BartForConditionalGeneration(bart).eval(),
    }


def step(model, token, encoder_outputs, cache):
    """One greedy decoding step as generate() takes it: the logits of `token` and the cache to pass back."""
    outputs = model(decoder_input_ids=token, encoder_outputs=encoder_outputs, cache=cache, use_cache=True)
    return outputs.logits[:, -1], outputs.cache


@torch.no_grad()
def check_against_generate(model, source, encoder_outputs, steps=32):
    """Fail unless `step` gives generate()'s logits, step for step (this also warms the model up)."""
    expected = model.generate(
        source, max_new_tokens=steps, do_sample=False, num_beams=1, output_logits=True, return_dict_in_generate=True
    )
    token, cache = torch.tensor([[model.generation_config.decoder_start_token_id]]), None
    for expected_logits in expected.logits:  # fewer than `steps` if generate() met the end-of-sequence token
        logits, cache = step(model, token, encoder_outputs, cache)
        torch.testing.assert_close(logits, expected_logits)
        token = logits.argmax(dim=-1, keepdim=True)


@torch.no_grad()
def decode(model, encoder_outputs, lengths) -> dict[int, tuple[float, int]]:
    """Greedy decoding up to the longest length; per length, the mean seconds of the WINDOW steps ending there
    (the forward and the argmax) and the cache bytes after that step."""
    token, cache = torch.tensor([[model.generation_config.decoder_start_token_id]]), None
    seconds, sizes = [], {}
    for generated in range(1, lengths[-1] + 1):
        start = time.perf_counter()
        logits, cache = step(model, token, encoder_outputs, cache)
        token = logits.argmax(dim=-1, keepdim=True)
        seconds.append(time.perf_counter() - start)
        if generated in lengths:
            sizes[generated] = cache_nbytes(cache)
    return {n: (statistics.fmean(seconds[n - WINDOW : n]), sizes[n]) for n in lengths}


@torch.no_grad()
def generate_ms_per_token(models, source, args) -> dict[str, list[float]]:
    """Per model, the ms per new token of each repeat's whole greedy generate() call (the encoder pass included),
    the models' order alternating."""
    found = {name: [] for name in models}
    tokens = args.generate_tokens
    for repeat in range(args.repeats):
        for name in list(models)[:: 1 if repeat % 2 == 0 else -1]:
            start = time.perf_counter()
            models[name].generate(source, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, num_beams=1)
            found[name].append(round(1e3 * (time.perf_counter() - start) / tokens, 4))
    return found


def measure(models, source, args) -> list[dict]:
    """Every (repeat, model, length) measurement, the models' order alternating between repeats."""
    encoded = {}
    for name, model in models.items():
        with torch.no_grad():
            encoded[name] = model.get_encoder()(source)
        check_against_generate(model, source, encoded[name])
    rows = []
    for repeat in range(args.repeats):
        for name in list(models)[:: 1 if repeat % 2 == 0 else -1]:
            results = decode(models[name], encoded[name], args.lengths)
            rows += [
                dict(model=name, repeat=repeat, generated_tokens=n, ms_per_token=round(1e3 * s, 4), cache_bytes=b)
                for n, (s, b) in results.items()
            ]
            print(f"repeat {repeat}: {name} done", file=sys.stderr)
    return rows


def header(record) -> list[str]:
    """The command, the machine, the date and the models (`record`: the run's header, settings and parameters)."""
    settings = record["settings"]
    start, parameters = report_start("# Decoding: time per token and cache size against generated tokens", record)
    return [
        *start,
        f"- Models: hidden {settings['hidden_size']}, {settings['heads']} heads, feed-forward "
        f"{settings['intermediate_size']}, {settings['encoder_layers']} encoder and {settings['decoder_layers']} "
        f"decoder layers, random weights, fp32, batch 1; parameters {parameters}. Fastformer: no layer sharing, "
        f"{settings['cross_attention']} cross-attention; BART: sdpa attention, DynamicCache.",
        f"- Method: a {settings['source_length']}-token random source encoded once; greedy decoding by the model's "
        "forward one token at a time with the cache, as generate() steps (checked against its logits). ms/token is "
        f"the mean of the {WINDOW} steps ending at the length; median, min and max over {settings['repeats']} "
        "repeats, the models' order alternating. Cache MB: the cache's tensors after that step.",
        "",
    ]


def medians(rows) -> tuple[dict, dict, dict]:
    """The medians (ms/token) and cache MB by (model, generated tokens), and every repeat's ms/token."""
    groups = {}
    for row in rows:
        groups.setdefault((row["model"], row["generated_tokens"]), []).append(row)
    times = {key: [row["ms_per_token"] for row in group] for key, group in groups.items()}
    median = {key: statistics.median(values) for key, values in times.items()}
    cache = {key: group[0]["cache_bytes"] / 2**20 for key, group in groups.items()}  # MB, the same every repeat
    return median, cache, times


def tables(record, rows) -> list[str]:
    """The header; medians per model and length, BART over Fastformer per length, the growth with the length."""
    median, cache, times = medians(rows)
    lengths = record["settings"]["lengths"]
    cells = [[name, n, f"{median[name, n]:.3f}", f"{min(values):.3f} - {max(values):.3f}", f"{cache[name, n]:.2f}"]
             for (name, n), values in times.items()]  # fmt: skip
    ratios = [[n, *(f"{d['BART', n] / d['Fastformer', n]:.2f}" for d in (median, cache))] for n in lengths]
    lines = [*header(record), *table(["model", "generated tokens", "ms/token (median)", "min - max", "cache MB"],
                                     cells)]  # fmt: skip
    lines += ["", *table(["generated tokens", "BART / Fastformer, ms/token", "BART / Fastformer, cache"], ratios), ""]
    for name in ("Fastformer", "BART"):
        growth = median[name, lengths[-1]] / median[name, lengths[0]]
        lines.append(f"- {name}: ms/token at {lengths[-1]} tokens / at {lengths[0]} = {growth:.2f}")
    if "generate_ms_per_token" in record:  # runs recorded before generate() was timed have none
        through = {name: statistics.median(values) for name, values in record["generate_ms_per_token"].items()}
        lines.append(
            f"- Through generate() (greedy, {record['settings']['generate_tokens']} new tokens, the encoder pass "
            f"included; median of {record['settings']['repeats']}): Fastformer {through['Fastformer']:.3f} ms/token, "
            f"BART {through['BART']:.3f}; BART / Fastformer = {through['BART'] / through['Fastformer']:.2f}"
        )
    return lines


def report(csv_path: Path, markdown: Path) -> str:
    return csv_report(csv_path, markdown, tables)


def plot(rows, args):
    """ms/token and cache MB against generated tokens, log-log."""
    median, cache, _ = medians(rows)
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, values, unit in zip(axes, (median, cache), ("ms per token", "cache MB")):
        lines = {name: [(n, values[name, n]) for n in args.lengths] for name in ("Fastformer", "BART")}
        log_log(axis, lines, args.lengths, "generated tokens", unit, unit)
    axes[0].legend()
    save_figure(figure, args.plot)


def run(args):
    """Measure, then write the CSV (and its .json), the markdown report and the plot."""
    torch.set_num_threads(args.threads)
    models = build_models(args)
    start = time.perf_counter()
    source = torch.randint(1000, models["Fastformer"].config.vocab_size, (1, args.source_length))
    rows = measure(models, source, args)
    generate_ms = generate_ms_per_token(models, source, args)
    elapsed = time.perf_counter() - start
    write_measurements(args.csv, rows, args, SETTINGS, models, elapsed, generate_ms_per_token=generate_ms)
    print(report(args.csv, args.markdown))
    plot(rows, args)


if __name__ == "__main__":
    args = parse_args()
    report(args.csv, args.markdown) if args.report else run(args)
