"""Encoder forward time, forward+backward time and peak memory against sequence length: Fastformer and its peers
(docs/ENCODER.md). A model predicted above --max-seconds or --max-memory-gb at a length is not run from there on.

    python -m benchmarks.encoder                                    # 512..65536 tokens, 3 repeats, 2 threads
    python -m benchmarks.encoder --lengths 512 2048 --repeats 1     # a quick check
    python -m benchmarks.encoder --lengths 16384 65536 --models Fastformer floor FNet
"""

import itertools
import math
import statistics
import sys
import time
from pathlib import Path

import psutil
import torch
import transformers
from torch import nn

from benchmarks import harness
from benchmarks.harness import DOCS, log_log, plt, random_ids, save_figure, table
from fastformer import FastformerConfig, FastformerModel
from fastformer.modeling_fastformer import FastformerEmbeddings, FastformerLayer

SIZE = {"hidden-size": 256, "layers": 4, "heads": 16, "intermediate-size": 1024, "vocab-size": 30522}
MODELS = "Fastformer Fastformer-plain floor BERT FNet Longformer BigBird fast-transformer-pytorch".split()
COLUMNS = {"forward_ms": "ms per forward", "forward_backward_ms": "ms per forward+backward", "peak_mb": "peak MB"}
RATIOS = [(top, "floor") for top in ("Fastformer", "Fastformer-plain")]
RATIOS += [(top, "Fastformer") for top in ("fast-transformer-pytorch", "BERT")]


class FloorEncoder(nn.Module):
    """The plain path's Linear and LayerNorm work with the additive-attention math removed (u = key + value in place
    of the two poolings): a bound for any implementation that runs those Linear layers (docs/ENCODER.md)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.embeddings = FastformerEmbeddings(config)
        self.layers = nn.ModuleList(FastformerLayer(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids) -> torch.Tensor:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        hidden_states = self.embeddings(input_ids, position_ids)  # (B, N, C)
        for layer in self.layers:
            attention = layer.attention
            u = attention.key(hidden_states) + attention.value(hidden_states)
            query = attention.query(hidden_states)
            hidden_states = layer.attention_output(attention.transform(u) + query, hidden_states)
            hidden_states = layer.feed_forward(hidden_states)
        return hidden_states


def parse_args(argv=None):
    parser = harness.arguments(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=None, help="calls per measurement (default: ~0.5 s)")
    for flag, default in SIZE.items():
        parser.add_argument(f"--{flag}", type=int, default=default, help="of every model")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="per forward+backward, predicted")
    available = round(0.6 * psutil.virtual_memory().available / 2**30, 1)  # GB
    parser.add_argument("--max-memory-gb", type=float, default=available, help="peak, predicted (default: 60%% free)")
    parser.add_argument("--attention-window", type=int, default=256, help="Longformer's")
    parser.add_argument("--block-size", type=int, default=64, help="BigBird's")
    parser.add_argument("--profile", type=int, metavar="ROWS", help="instead: each model's ROWS top operators per step")
    parser.add_argument("--output", type=Path, help="the record, CSV and figures beside it (docs/encoder.json)")
    args = parser.parse_args(argv)
    args.output = args.output or DOCS / ("profile.json" if args.profile else "encoder.json")
    args.lengths = sorted(set(args.lengths))
    return args


def build(name, args):
    """`name` of the benchmark's size in eval mode, no dropout, random weights from the same seed; the transformers
    encoders without their poolers."""
    torch.manual_seed(0)
    size = dict(vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers)
    size.update(num_attention_heads=args.heads, intermediate_size=args.intermediate_size, hidden_dropout_prob=0.0)
    size.update(max_position_embeddings=args.lengths[-1])
    if name in ("Fastformer", "Fastformer-plain", "floor"):
        config = FastformerConfig(**size, share_layers=False, share_query_value=False)
        if name == "floor":
            model = FloorEncoder(config)
        else:
            model = FastformerModel(config, add_pooling_layer=False)
            model.set_additive_attention_mode("plain" if name == "Fastformer-plain" else "collapsed")
    elif name == "fast-transformer-pytorch":
        from fast_transformer_pytorch import FastTransformer  # noqa: PLC0415  (the [bench] extra, this model only)

        size = dict(num_tokens=args.vocab_size, dim=args.hidden_size, depth=args.layers, max_seq_len=args.lengths[-1])
        size.update(heads=args.heads, dim_head=args.hidden_size // args.heads)
        model = FastTransformer(**size, ff_mult=args.intermediate_size // args.hidden_size, absolute_pos_emb=True)
        model.to_logits = model.to_logits[0]  # its final LayerNorm, without the vocabulary projection
    else:
        size.update(attention_probs_dropout_prob=0.0, type_vocab_size=1)
        if name == "BERT":
            size.update(attn_implementation="sdpa")
        elif name == "Longformer":  # RoBERTa-style positions start after the padding index 1
            size.update(attention_window=args.attention_window, max_position_embeddings=args.lengths[-1] + 2)
        elif name == "BigBird":
            size.update(attention_type="block_sparse", block_size=args.block_size)
        prefix = "Bert" if name == "BERT" else name
        config = getattr(transformers, f"{prefix}Config")(**size)
        model = getattr(transformers, f"{prefix}Model")(config, add_pooling_layer=False)
    return model.eval()


def hidden_states(model, input_ids) -> torch.Tensor:
    """The last hidden states of any of the models."""
    if isinstance(model, FloorEncoder):
        return model(input_ids)
    if not isinstance(model, transformers.PreTrainedModel):  # fast-transformer-pytorch, whose mask=None crashes
        return model(input_ids, mask=torch.ones_like(input_ids, dtype=torch.bool))
    if getattr(model, "attention_type", "block_sparse") != "block_sparse":
        model.set_attention_type("block_sparse")  # BigBird turns to full attention for good after one short input
    return model(input_ids=input_ids).last_hidden_state


def forward(model, input_ids):
    with torch.no_grad():
        hidden_states(model, input_ids)


def forward_backward(model, input_ids):
    model.zero_grad(set_to_none=True)
    hidden_states(model, input_ids).sum().backward()


def prepare_forward_backward(name, length, args):
    """For harness.peak_megabytes: `name` built alone, one forward+backward at `length` tokens to run."""
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    model, input_ids = build(name, args), random_ids(length, args.vocab_size)
    return lambda: forward_backward(model, input_ids)


def predict(history: list[tuple[int, float]], length: int) -> float | None:
    """A measure at `length` from (length, value) pairs at shorter lengths: the growth between the last two
    extrapolated, at least linear (quadratic when there is one pair only); None before any measurement."""
    if not history:
        return None
    (last_length, last), exponent = history[-1], 2.0
    if len(history) > 1:
        previous_length, previous = history[-2]
        exponent = max(1.0, math.log(max(last, 1e-9) / max(previous, 1e-9)) / math.log(last_length / previous_length))
    return last * (length / last_length) ** exponent


def skip_reason(name, length, history, args) -> str | None:
    """Why `name` is not run at `length`, from its measurements at shorter lengths, or None."""
    seconds = predict(history.get((name, "seconds"), []), length)
    if seconds is not None and seconds > args.max_seconds:
        return f"predicted {seconds:.3g} s per forward+backward, above --max-seconds {args.max_seconds:g}"
    gigabytes = predict(history.get((name, "peak_gb"), []), length)
    if gigabytes is not None and gigabytes > args.max_memory_gb:
        return f"predicted {gigabytes:.3g} GB peak, above --max-memory-gb {args.max_memory_gb:g}"
    return None


def measure(models, args) -> list[dict]:
    """Every (model, length, repeat) measurement, and a row with a note for each model not run at a length."""
    steps = {"forward_ms": forward, "forward_backward_ms": forward_backward}
    rows, history, skipped = [], {}, {}
    for length in args.lengths:
        memory = {}
        for name in models:
            skipped[name] = skipped.get(name) or skip_reason(name, length, history, args)
            if skipped[name] is None:
                peak = harness.peak_megabytes(prepare_forward_backward, name, length, args)
                if peak is None:
                    skipped[name] = f"killed (out of memory) during forward+backward at {length} tokens"
                else:
                    memory[name] = round(peak, 1)
                    history.setdefault((name, "peak_gb"), []).append((length, peak / 1024))
        input_ids = random_ids(length, args.vocab_size)
        runnable = [name for name in models if skipped[name] is None]
        iterations = {}
        for name, (column, step) in itertools.product(runnable, steps.items()):
            iterations[name, column] = args.iterations or harness.calls_to_fill(lambda: step(models[name], input_ids))
        for repeat in range(args.repeats):
            for name in runnable[:: 1 if repeat % 2 == 0 else -1]:
                row = dict(model=name, length=length, repeat=repeat)
                for column, step in steps.items():
                    calls = iterations[name, column]
                    seconds = harness.seconds_per_call(lambda: step(models[name], input_ids), calls)
                    row[column], row[column.replace("_ms", "_iterations")] = round(1e3 * seconds, 3), calls
                rows.append(dict(row, peak_mb=memory[name]))
        times = median_by([row for row in rows if row["length"] == length], "forward_backward_ms", "model")
        for (name,), ms in times.items():
            history.setdefault((name, "seconds"), []).append((length, ms / 1e3))
        rows += [dict(model=name, length=length, note=skipped[name]) for name in models if name not in runnable]
        print(f"length {length} done", file=sys.stderr)
    return rows


def median_by(rows, column, *keys) -> dict:
    """The median of `column` over the rows of each value of `keys` (rows without the column left out)."""
    values = {}
    for row in rows:
        if row.get(column) is not None:
            values.setdefault(tuple(row[key] for key in keys), []).append(row[column])
    return {key: statistics.median(found) for key, found in values.items()}


def tables(record) -> str:
    """Per measure, the medians by model and length; then the ratios of medians per length."""
    rows, lengths = record["rows"], record["settings"]["lengths"]
    median = {column: median_by(rows, column, "model", "length") for column in COLUMNS}
    names = list(dict.fromkeys(row["model"] for row in rows))

    def cell(column, name, n):
        value = median[column].get((name, n))
        return "not run" if value is None else f"{value:.{1 if column == 'peak_mb' else 2}f}"

    found = []
    for column, title in COLUMNS.items():
        found.append(table([title, *lengths], [[name, *(cell(column, name, n) for n in lengths)] for name in names]))
    ratios = []
    for (top, bottom), n in itertools.product(RATIOS, lengths):
        pairs = [(median[column].get((top, n)), median[column].get((bottom, n))) for column in COLUMNS]
        cells = ["not run" if a is None or b is None else f"{a / b:.2f}" for a, b in pairs]
        if set(cells) != {"not run"}:
            ratios.append([f"{top} / {bottom}", n, *cells])
    found.append(table(["ratio of medians", "length", "forward", "forward+backward", "peak MB"], ratios))
    return "\n\n".join(found)


def plot(rows, lengths, folder: Path):
    """Log-log time against length (forward, forward+backward) and peak memory against length."""
    names = list(dict.fromkeys(row["model"] for row in rows))

    def lines(column):
        median = median_by(rows, column, "model", "length")
        return {name: [(n, median[name, n]) for n in lengths if (name, n) in median] for name in names}

    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, column, title in zip(axes, ("forward_ms", "forward_backward_ms"), ("forward", "forward+backward")):
        log_log(axis, lines(column), lengths, "sequence length", "ms", title)
    axes[0].legend()
    save_figure(figure, folder / "encoder_time.png")
    figure, axis = plt.subplots(figsize=(6, 5))
    log_log(axis, lines("peak_mb"), lengths, "sequence length", "MB", "peak memory, forward+backward")
    axis.legend()
    save_figure(figure, folder / "encoder_memory.png")


def profile(models, args) -> list[dict]:
    """Per length, model and step: the --profile operators of most self CPU time over one call after a warm-up call."""
    rows = []
    steps = {"forward": forward, "forward+backward": forward_backward}
    for length, (name, model), (title, step) in itertools.product(args.lengths, models.items(), steps.items()):
        input_ids = random_ids(length, args.vocab_size)
        step(model, input_ids)
        with torch.profiler.profile() as profiler:
            step(model, input_ids)
        events = sorted(profiler.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
        total = sum(event.self_cpu_time_total for event in events)  # microseconds
        found = []
        for event in events[: args.profile]:
            us = event.self_cpu_time_total
            row = dict(model=name, length=length, step=title, operator=event.key, calls=event.count)
            found.append(dict(row, self_ms=us / 1e3, share=us / total, total_ms=total / 1e3))
        cells = [[row["operator"], row["calls"], f"{row['self_ms']:.1f}", f"{row['share']:.0%}"] for row in found]
        print(f"{name}, {title}, {length} tokens: total self CPU time {total / 1e3:.0f} ms", end="\n\n")
        print(table(["operator", "calls", "self ms", "share"], cells), end="\n\n")
        rows += found
    return rows


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # BigBird's warning at every short input
    models = {name: build(name, args) for name in args.models}
    start = time.perf_counter()
    rows = profile(models, args) if args.profile else measure(models, args)
    minutes = round((time.perf_counter() - start) / 60, 1)
    parameters = {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()}
    record = harness.write_record(args.output, rows, args, minutes=minutes, parameters=parameters)
    if not args.profile:  # the profile printed its tables as it went
        print(tables(record))
        plot(rows, args.lengths, args.output.parent)


if __name__ == "__main__":
    main()
