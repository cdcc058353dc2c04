"""Per-token decoding time and cache size against the number of generated tokens: Fastformer vs BART.

FastformerForConditionalGeneration and BartForConditionalGeneration (sdpa attention, its usual growing KV
cache) of the same size, random weights, fp32, batch 1, eval mode, no_grad. Each model encodes one fixed
random source once; then greedy decoding calls the model's forward one token at a time exactly as generate()
does (last token, the returned cache passed back, use_cache=True), without generate()'s stopping logic.
Before timing, each model's steps are checked against generate()'s logits. The step time at a length is the
mean over the WINDOW steps ending there; the cache size is taken right after that step.

The machine is assumed noisy: every repeat decodes up to the longest length once per model, with the models'
order alternating between repeats, and the tables report medians over repeats.

The run's settings, parameters and header go to the CSV's .json beside it, from which --report rewrites the
markdown report without measuring.

Usage (`python -m benchmarks.suite` runs this and the encoder benchmark in one command):
    python -m benchmarks.decoding                                # 64..8192 tokens, 3 repeats, 2 threads
    python -m benchmarks.decoding --lengths 64 256 --repeats 2   # a quick check
    python -m benchmarks.decoding --report                       # docs/DECODING.md from docs/decoding.csv
"""

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from transformers import BartConfig, BartForConditionalGeneration

from benchmarks.harness import DOCS, label_lengths, plt, read_json, table, write_measurements, write_text
from fastformer import FastformerConfig, FastformerForConditionalGeneration
from fastformer.modeling_fastformer import cache_nbytes

WINDOW = 16  # steps averaged per length
SETTINGS = ("lengths", "repeats", "source_length", "hidden_size", "heads", "intermediate_size", "encoder_layers",
            "decoder_layers", "cross_attention")  # fmt: skip


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)], help="generated tokens")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--source-length", type=int, default=512, help="encoder input tokens")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--encoder-layers", type=int, default=2)
    parser.add_argument("--decoder-layers", type=int, default=4)
    parser.add_argument(
        "--cross-attention", choices=["softmax", "additive"], default="softmax", help="Fastformer's only"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=DOCS / "decoding.csv", help="every measurement")
    parser.add_argument("--markdown", type=Path, default=DOCS / "DECODING.md", help="the report")
    parser.add_argument("--plot", type=Path, default=DOCS / "decoding.png", help="time and cache against tokens")
    parser.add_argument("--report", action="store_true", help="only rewrite --markdown from --csv and its .json")
    args = parser.parse_args(argv)
    args.lengths = sorted(set(args.lengths))
    if args.lengths[0] < WINDOW:
        parser.error(f"every length must be at least {WINDOW}, the number of steps averaged")
    return args


def build_models(args) -> dict[str, transformers.PreTrainedModel]:
    """The two models, same widths and layer counts, random weights, no dropout, eval mode."""
    positions = max(args.lengths[-1], args.source_length)
    fastformer = FastformerConfig(
        hidden_size=args.hidden_size,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.encoder_layers,
        num_decoder_layers=args.decoder_layers,
        share_layers=False,  # one parameter set per layer, as BART
        cross_attention_type=args.cross_attention,
        hidden_dropout_prob=0.0,
        max_position_embeddings=positions,
        decoder_start_token_id=101,  # [CLS] of the bert-base-uncased vocabulary
    )
    bart = BartConfig(
        vocab_size=fastformer.vocab_size,
        d_model=args.hidden_size,
        encoder_attention_heads=args.heads,
        decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.intermediate_size,
        decoder_ffn_dim=args.intermediate_size,
        encoder_layers=args.encoder_layers,
        decoder_layers=args.decoder_layers,
        max_position_embeddings=positions,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        attn_implementation="sdpa",
    )
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


def measure(models, args) -> list[dict]:
    """Every (repeat, model, length) measurement, the models' order alternating between repeats."""
    source = torch.randint(1000, models["Fastformer"].config.vocab_size, (1, args.source_length))
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
    parameters = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in record["parameters"].items())
    return [
        "# Decoding: time per token and cache size against generated tokens",
        "",
        *record["header"],
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
        groups.setdefault((row["model"], int(row["generated_tokens"])), []).append(row)
    times = {key: [float(row["ms_per_token"]) for row in group] for key, group in groups.items()}
    median = {key: statistics.median(values) for key, values in times.items()}
    cache = {key: int(group[0]["cache_bytes"]) / 2**20 for key, group in groups.items()}  # MB, the same every repeat
    return median, cache, times


def tables(rows, lengths) -> list[str]:
    """Medians per model and length, BART over Fastformer per length, and the growth from shortest to longest."""
    median, cache, times = medians(rows)
    cells = [[name, n, f"{median[name, n]:.3f}", f"{min(values):.3f} - {max(values):.3f}", f"{cache[name, n]:.2f}"]
             for (name, n), values in times.items()]  # fmt: skip
    ratios = [[n, *(f"{d['BART', n] / d['Fastformer', n]:.2f}" for d in (median, cache))] for n in lengths]
    lines = [*table(["model", "generated tokens", "ms/token (median)", "min - max", "cache MB"], cells), ""]
    lines += [*table(["generated tokens", "BART / Fastformer, ms/token", "BART / Fastformer, cache"], ratios), ""]
    for name in ("Fastformer", "BART"):
        growth = median[name, lengths[-1]] / median[name, lengths[0]]
        lines.append(f"- {name}: ms/token at {lengths[-1]} tokens / at {lengths[0]} = {growth:.2f}")
    return lines


def read_rows(path: Path) -> list[dict]:
    with path.open() as file:
        return list(csv.DictReader(file))


def report(csv_path: Path, markdown: Path) -> str:
    """The markdown report from the CSV and its .json; written to `markdown` and returned."""
    record = read_json(csv_path.with_suffix(".json"))
    return write_text(markdown, header(record) + tables(read_rows(csv_path), record["settings"]["lengths"]))


def plot(median, cache, args):
    """ms/token and cache MB against generated tokens, log-log."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, values, unit in zip(axes, (median, cache), ("ms per token", "cache MB")):
        for name in ("Fastformer", "BART"):
            axis.plot(args.lengths, [values[name, n] for n in args.lengths], marker="o", label=name)
        axis.set(xscale="log", yscale="log", xlabel="generated tokens", ylabel=unit, title=unit)
        label_lengths(axis, args.lengths)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.plot, dpi=120)


def run(args) -> tuple[dict, dict]:
    """Measure, write the CSV (and its .json), the markdown report and the plot; return the medians (ms/token) and
    cache MB by (model, generated tokens)."""
    torch.set_num_threads(args.threads)
    models = build_models(args)
    start = time.perf_counter()
    rows = measure(models, args)
    write_measurements(args.csv, rows, args, SETTINGS, models, time.perf_counter() - start)
    print(report(args.csv, args.markdown))
    median, cache, _ = medians(rows)
    plot(median, cache, args)
    return median, cache


if __name__ == "__main__":
    args = parse_args()
    if args.report:
        report(args.csv, args.markdown)
    else:
        run(args)
