"""Encoder forward time, forward+backward time and peak memory against sequence length: Fastformer and its peers.

Models, all with the same width, depth, heads and feed-forward size, random weights, no dropout, fp32, batch 1,
eval mode, learned absolute positions up to the longest length:
  - Fastformer: FastformerModel, no layer or query-value sharing (as many parameters as its peers), no pooler.
    Its layers take the collapsed path (attention_implementation="collapsed", FastformerLayer.collapsed_attention:
    the attention sub-layer's five Linear layers folded into one matrix per sequence).
  - Fastformer-plain: the same model with attention_implementation="plain" (five Linear layers, then the
    attention math).
  - floor: FloorEncoder below, the plain path's Linear and LayerNorm work with the additive-attention math
    removed: no implementation of the plain formulation can beat it; the collapsed one does less work.
  - BERT: BertModel with sdpa attention.
  - FNet: FNetModel (Fourier token mixing, no heads).
  - Longformer: LongformerModel, sliding window of --attention-window tokens, no global tokens.
  - BigBird: BigBirdModel, block_sparse attention, blocks of --block-size; transformers itself falls back to full
    attention at lengths up to (5 + 2 * 3 random blocks) * block size (704 for blocks of 64).
  - fast-transformer-pytorch: lucidrains' FastTransformer (pre-LN Fastformer with absolute positions), its
    vocabulary projection removed so that it returns the final LayerNorm's output as the others do.
Longformer and BigBird pad the input to a multiple of their window or block themselves and cut the output back.

Each model is wrapped as a callable `(input_ids) -> last hidden states`. Forward is timed under no_grad;
forward+backward is `output.sum().backward()` with the gradients reset (set to None) first. Per length, every
model is warmed up once; then each repeat measures every model in turn, the models' order alternating between
repeats, and the tables report medians over repeats. A measurement is the mean over --iterations calls (by
default as many as fill about 0.5 s, judged from the warm-up; 1 at long lengths).

Not every model fits every length. Before a length, each model's forward+backward time and peak memory there
are predicted from its two previous lengths (the growth between them extrapolated, quadratic after the first);
a model predicted above --max-seconds per forward+backward or --max-memory-gb is "not run" at this length and
longer ones, with the prediction as the reason. Peak memory is measured first, in a fresh process, so that a
model that does not fit is found (its process killed) before the timing process tries it.

Peak memory (Linux only): each (model, length) forward+backward runs once more in a fresh process, which builds
that model alone, resets the kernel's peak resident memory (VmHWM) to the resident memory now (VmRSS), runs
forward+backward and reads VmHWM (harness.peak_megabytes). The difference is the memory forward+backward needed
beyond the built model: activations, temporaries and the parameters' gradients.

The run's settings, parameters and header go to the CSV's .json beside it, from which --report rewrites the
markdown report without measuring.

Usage (`python -m benchmarks.suite` runs this and the decoding benchmark in one command):
    python -m benchmarks.encoder                                    # 512..65536 tokens, 3 repeats, 2 threads
    python -m benchmarks.encoder --lengths 512 2048 --repeats 1     # a quick check
    python -m benchmarks.encoder --lengths 16384 65536 --models Fastformer floor FNet
    python -m benchmarks.encoder --report                           # docs/ENCODER.md from docs/encoder.csv
"""

import argparse
import csv
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import (
    BertConfig,
    BertModel,
    BigBirdConfig,
    BigBirdModel,
    FNetConfig,
    FNetModel,
    LongformerConfig,
    LongformerModel,
)

from benchmarks.harness import (
    DOCS,
    calls_to_fill,
    label_lengths,
    memory_available_gb,
    peak_megabytes,
    plt,
    read_json,
    seconds_per_call,
    table,
    write_measurements,
    write_text,
)
from benchmarks.specs import ENCODER_RATIOS
from fastformer import FastformerConfig, FastformerModel
from fastformer.modeling_fastformer import FastformerEmbeddings, FastformerLayer

MAX_LENGTH = 65536
TARGET_SECONDS = 0.5  # per measurement, when --iterations is not given


class FloorEncoder(nn.Module):
    """The plain formulation's Linear and LayerNorm work with the additive-attention math removed.

    Each layer runs the query, key, value and transform (W_r) Linear layers of FastformerAttention on the hidden
    states, with u = key + value in place of the two additive poolings (the sum, so that the key's Linear is in
    the backward pass as well), keeps the query residual, then attention_output and feed_forward exactly as
    FastformerLayer does. No implementation that runs these Linear layers can beat it; Fastformer's collapsed
    path folds the first five into one, so it can.
    """

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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--models", nargs="+", choices=list(BUILDERS), default=list(BUILDERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=None, help="calls per measurement (default: ~0.5 s)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument(
        "--max-seconds", type=float, default=60.0, help="skip a model predicted slower per forward+backward"
    )
    parser.add_argument(
        "--max-memory-gb",
        type=float,
        default=round(0.6 * memory_available_gb(), 1),
        help="skip a model predicted to need more for forward+backward (default: 60%% of the memory available now)",
    )
    parser.add_argument("--attention-window", type=int, default=256, help="Longformer's")
    parser.add_argument("--block-size", type=int, default=64, help="BigBird's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=DOCS / "encoder.csv", help="every measurement")
    parser.add_argument("--markdown", type=Path, default=DOCS / "ENCODER.md", help="the report")
    parser.add_argument("--plots", type=Path, default=DOCS, help="folder for encoder_time.png, encoder_memory.png")
    parser.add_argument("--report", action="store_true", help="only rewrite --markdown from --csv and its .json")
    args = parser.parse_args(argv)
    args.lengths = sorted(set(args.lengths))
    if not 1 <= args.lengths[0] <= args.lengths[-1] <= MAX_LENGTH:
        parser.error(f"lengths must lie in 1..{MAX_LENGTH}")
    if "Fastformer" not in args.models:
        parser.error("the report compares every model with Fastformer: keep it in --models")
    return args


def bert_like(args) -> dict:
    """The size settings BERT, FNet, Longformer and BigBird configs share."""
    return dict(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        intermediate_size=args.intermediate_size,
        hidden_dropout_prob=0.0,
        max_position_embeddings=args.lengths[-1],
        type_vocab_size=1,
    )


def fastformer_config(args, attention_implementation="collapsed") -> FastformerConfig:
    return FastformerConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate_size,
        share_layers=False,
        share_query_value=False,
        hidden_dropout_prob=0.0,
        max_position_embeddings=args.lengths[-1],
        attention_implementation=attention_implementation,
    )


def last_hidden_state(model):
    return lambda input_ids: model(input_ids=input_ids).last_hidden_state


def build_fastformer(args):
    model = FastformerModel(fastformer_config(args), add_pooling_layer=False)
    return model, last_hidden_state(model)


def build_fastformer_plain(args):
    model = FastformerModel(fastformer_config(args, attention_implementation="plain"), add_pooling_layer=False)
    return model, last_hidden_state(model)


def build_floor(args):
    model = FloorEncoder(fastformer_config(args))
    return model, model


def build_bert(args):
    config = BertConfig(
        **bert_like(args), num_attention_heads=args.heads, attention_probs_dropout_prob=0.0, attn_implementation="sdpa"
    )
    model = BertModel(config, add_pooling_layer=False)
    return model, last_hidden_state(model)


def build_fnet(args):
    model = FNetModel(FNetConfig(**bert_like(args)), add_pooling_layer=False)
    return model, last_hidden_state(model)


def build_longformer(args):
    settings = bert_like(args)
    settings["max_position_embeddings"] += 2  # RoBERTa-style positions start after the padding index 1
    config = LongformerConfig(
        **settings,
        num_attention_heads=args.heads,
        attention_probs_dropout_prob=0.0,
        attention_window=args.attention_window,
    )
    model = LongformerModel(config, add_pooling_layer=False)
    return model, last_hidden_state(model)


def build_bigbird(args):
    config = BigBirdConfig(
        **bert_like(args),
        num_attention_heads=args.heads,
        attention_probs_dropout_prob=0.0,
        attention_type="block_sparse",
        block_size=args.block_size,
    )
    model = BigBirdModel(config, add_pooling_layer=False)

    def call(input_ids):
        # BigBird switches itself to full attention for good after one short input; switch back for long ones
        if model.attention_type != "block_sparse":
            model.set_attention_type("block_sparse")
        return model(input_ids=input_ids).last_hidden_state

    return model, call


def build_fast_transformer(args):
    from fast_transformer_pytorch import FastTransformer

    model = FastTransformer(
        num_tokens=args.vocab_size,
        dim=args.hidden_size,
        depth=args.layers,
        max_seq_len=args.lengths[-1],
        heads=args.heads,
        dim_head=args.hidden_size // args.heads,
        ff_mult=args.intermediate_size // args.hidden_size,
        absolute_pos_emb=True,
    )
    model.to_logits = model.to_logits[0]  # its final LayerNorm, without the vocabulary projection

    def call(input_ids):
        return model(input_ids, mask=torch.ones_like(input_ids, dtype=torch.bool))  # mask=None crashes

    return model, call


BUILDERS = {
    "Fastformer": build_fastformer,
    "Fastformer-plain": build_fastformer_plain,
    "floor": build_floor,
    "BERT": build_bert,
    "FNet": build_fnet,
    "Longformer": build_longformer,
    "BigBird": build_bigbird,
    "fast-transformer-pytorch": build_fast_transformer,
}


def build(name, args):
    """The model in eval mode and its `(input_ids) -> last hidden states` callable, same seed for every model."""
    torch.manual_seed(args.seed)
    model, call = BUILDERS[name](args)
    return model.eval(), call


def predict(history: list[tuple[int, float]], length: int) -> float | None:
    """A measure at `length` from (length, value) pairs at shorter lengths: the growth between the last two
    extrapolated, at least linear (quadratic when there is one pair only); None before any measurement."""
    if not history:
        return None
    last_length, last = history[-1]
    exponent = 2.0
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


def random_ids(length, args) -> torch.Tensor:
    return torch.randint(1000, args.vocab_size, (1, length), generator=torch.Generator().manual_seed(length))


def forward(model, call, input_ids):
    with torch.no_grad():
        call(input_ids)


def forward_backward(model, call, input_ids):
    model.zero_grad(set_to_none=True)
    call(input_ids).sum().backward()


def prepare_forward_backward(name, length, args):
    """For harness.peak_megabytes: `name` built alone, one forward+backward at `length` tokens to run."""
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    model, call = build(name, args)
    input_ids = random_ids(length, args)
    return lambda: forward_backward(model, call, input_ids)


def measure(models, args) -> list[dict]:
    """Every (model, length, repeat) measurement; lengths one after another, models interleaved within each."""
    steps = {"forward_ms": forward, "forward_backward_ms": forward_backward}
    rows, history, skipped = [], {}, {}
    for length in args.lengths:
        memory = {}
        for name in models:
            skipped[name] = skipped.get(name) or skip_reason(name, length, history, args)
            if skipped[name] is None:
                peak = peak_megabytes(prepare_forward_backward, name, length, args)
                if peak is None:
                    skipped[name] = f"killed (out of memory) during forward+backward at {length} tokens"
                else:
                    memory[name] = round(peak, 1)
                    history.setdefault((name, "peak_gb"), []).append((length, peak / 1024))
        input_ids = random_ids(length, args)
        runnable = [name for name in models if skipped[name] is None]
        iterations = {}
        for name in runnable:  # warm-up, which also sets the number of calls per measurement
            for column, step in steps.items():
                calls = calls_to_fill(lambda: step(*models[name], input_ids), TARGET_SECONDS)
                iterations[name, column] = args.iterations or calls
        for repeat in range(args.repeats):
            for name in runnable[:: 1 if repeat % 2 == 0 else -1]:
                row = dict(model=name, length=length, repeat=repeat)
                for column, step in steps.items():
                    seconds = seconds_per_call(lambda: step(*models[name], input_ids), iterations[name, column])
                    row[column] = round(1e3 * seconds, 3)
                    row[column.replace("_ms", "_iterations")] = iterations[name, column]
                rows.append(row)
        for row in rows:
            if row["length"] == length:
                row["peak_mb"] = memory[row["model"]]
        for name in runnable:
            times = [row["forward_backward_ms"] for row in rows if row["length"] == length and row["model"] == name]
            history.setdefault((name, "seconds"), []).append((length, statistics.median(times) / 1e3))
        rows += [dict(model=name, length=length, note=skipped[name]) for name in models if name not in runnable]
        print(f"length {length} done", file=sys.stderr)
    return rows


def header(record) -> list[str]:
    """The command, the machine, the date and the models (`record`: the run's header, settings and parameters)."""
    settings = record["settings"]
    parameters = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in record["parameters"].items())
    return [
        "# Encoder: forward time, forward+backward time and peak memory against sequence length",
        "",
        *record["header"],
        f"- Models: hidden {settings['hidden_size']}, {settings['layers']} layers, {settings['heads']} heads, "
        f"feed-forward {settings['intermediate_size']}, vocabulary {settings['vocab_size']}, "
        f"{settings['lengths'][-1]} positions, random weights, "
        f"no dropout, fp32, batch 1, eval mode; parameters {parameters}. Fastformer: no layer or query-value "
        "sharing, the collapsed attention sub-layer (one matrix per sequence for its five Linear layers); "
        "Fastformer-plain: the same model on the plain path. floor: the plain path's Linear and LayerNorm work "
        "without the additive attention (FloorEncoder in benchmarks/encoder.py), a bound for any implementation "
        "that runs those Linear layers (the collapsed path runs fewer). BERT: sdpa attention. "
        f"Longformer: window {settings['attention_window']}, no global tokens. BigBird: block_sparse, blocks of "
        f"{settings['block_size']}, 3 random blocks (transformers runs full attention at lengths up to "
        f"{(5 + 2 * 3) * settings['block_size']}). fast-transformer-pytorch: lucidrains' FastTransformer, absolute "
        "positions, without its vocabulary projection.",
        f"- Method: per length, one warm-up call per model; then {settings['repeats']} repeats, each measuring every "
        "model in turn, the order alternating; a measurement is the mean over its calls (column *_iterations of the "
        "CSV). Forward under no_grad; forward+backward: `output.sum().backward()`. Times: median over repeats. "
        "Peak MB: peak resident memory (VmHWM, reset just before) over one forward+backward minus the resident "
        "memory before it, in a fresh process that holds that model only (activations, temporaries and "
        "parameter gradients, not the weights).",
        "",
    ]


COLUMNS = {"forward_ms": "ms per forward", "forward_backward_ms": "ms per forward+backward", "peak_mb": "peak MB"}


def medians(rows) -> tuple[dict, list[str]]:
    """The medians over repeats by (column, model, length), and the models in order."""
    values = {}
    for row in rows:
        for column in COLUMNS:
            if column in row:
                values.setdefault((column, row["model"], row["length"]), []).append(row[column])
    names = list(dict.fromkeys(row["model"] for row in rows))
    return {key: statistics.median(found) for key, found in values.items()}, names


def tables(rows, lengths) -> list[str]:
    """The report's tables: per measure, model x length medians; then the ratios per length; then what was not run."""
    median, names = medians(rows)

    def cell(column, name, length):
        value = median.get((column, name, length))
        return "not run" if value is None else f"{value:.{1 if column == 'peak_mb' else 2}f}"

    lines = []
    for column, title in COLUMNS.items():
        cells = [[name, *(cell(column, name, n) for n in lengths)] for name in names]
        lines += [f"## {title}", "", *table(["model", *map(str, lengths)], cells), ""]
    ratios = []
    for top, bottom in (pair for pair in ENCODER_RATIOS if set(pair) <= set(names)):
        for n in lengths:
            cells = []
            for column in COLUMNS:
                a, b = median.get((column, top, n)), median.get((column, bottom, n))
                cells.append("not run" if a is None or b is None or b == 0 else f"{a / b:.2f}")
            if set(cells) != {"not run"}:
                ratios.append([f"{top} / {bottom}", n, *cells])
    lines += ["## Ratios (medians)", "",
              *table(["ratio", "length", "forward", "forward+backward", "peak MB"], ratios), ""]  # fmt: skip
    first_skips = {}
    for row in rows:
        if "note" in row:
            first_skips.setdefault(row["model"], row)
    if first_skips:
        lines += ["## Not run", ""]
        lines += [f"- {name} from {row['length']} tokens on: {row['note']}" for name, row in first_skips.items()]
        lines.append("")
    return lines


def read_rows(path: Path) -> list[dict]:
    """The measurements of encoder.csv, numbers as numbers, empty cells left out."""
    types = {"length": int, "repeat": int, "forward_iterations": int, "forward_backward_iterations": int}
    with path.open() as file:
        return [{key: types.get(key, float)(value) if key not in ("model", "note") else value
                 for key, value in row.items() if value != ""} for row in csv.DictReader(file)]  # fmt: skip


def report(csv_path: Path, markdown: Path) -> str:
    """The markdown report from the CSV and its .json; written to `markdown` and returned."""
    record = read_json(csv_path.with_suffix(".json"))
    return write_text(markdown, header(record) + tables(read_rows(csv_path), record["settings"]["lengths"]))


def plot(median, names, args):
    """Log-log time against length (forward, forward+backward) and peak memory against length."""
    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, column, title in zip(axes, ("forward_ms", "forward_backward_ms"), ("forward", "forward+backward")):
        for name in names:
            points = [(n, median[column, name, n]) for n in args.lengths if (column, name, n) in median]
            axis.plot(*zip(*points), marker="o", label=name)
        axis.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="ms", title=title)
        label_lengths(axis, args.lengths)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(args.plots / "encoder_time.png", dpi=120)
    figure, axis = plt.subplots(figsize=(6, 5))
    for name in names:
        points = [(n, median["peak_mb", name, n]) for n in args.lengths if ("peak_mb", name, n) in median]
        axis.plot(*zip(*points), marker="o", label=name)
    axis.set(xscale="log", yscale="log", xlabel="sequence length", ylabel="MB", title="peak memory, forward+backward")
    label_lengths(axis, args.lengths)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(args.plots / "encoder_memory.png", dpi=120)


SETTINGS = ("hidden_size", "layers", "heads", "intermediate_size", "vocab_size", "lengths", "attention_window",
            "block_size", "repeats", "threads")  # fmt: skip


def run(args) -> dict:
    """Measure, write the CSV (and its .json), the markdown report and the plots; return the medians by (column,
    model, length)."""
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # BigBird's warning at every short input
    models = {name: build(name, args) for name in args.models}
    start = time.perf_counter()
    rows = measure(models, args)
    write_measurements(
        args.csv,
        rows,
        args,
        SETTINGS,
        {name: model for name, (model, _) in models.items()},
        time.perf_counter() - start,
    )
    print(report(args.csv, args.markdown))
    median, names = medians(rows)
    args.plots.mkdir(parents=True, exist_ok=True)
    plot(median, names, args)
    return median


if __name__ == "__main__":
    args = parse_args()
    if args.report:
        report(args.csv, args.markdown)
    else:
        run(args)
