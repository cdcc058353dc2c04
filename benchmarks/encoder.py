"""Encoder forward time, forward+backward time and peak memory against sequence length: Fastformer and its peers.

Models of the same width, depth, heads and feed-forward size, random weights, no dropout, fp32, batch 1, eval mode
(the report's header describes each): Fastformer on its collapsed and plain paths, the floor (FloorEncoder), BERT,
FNet, Longformer, BigBird and lucidrains' fast-transformer-pytorch, each wrapped as `(input_ids) -> last hidden
states`. Per length every model is warmed up once; then each repeat measures every model in turn, the order
alternating, and the tables report medians over repeats.

Not every model fits every length: before a length, each model's forward+backward time and peak memory there are
predicted from its two previous lengths (the growth extrapolated); a model predicted above --max-seconds or
--max-memory-gb is not run at this length and longer ones. Peak memory (Linux) is measured first, in a fresh
process that holds that model alone (harness.peak_megabytes), so that a model that does not fit is found there.

Usage (`python -m benchmarks.suite` runs this and the decoding benchmark in one command):
    python -m benchmarks.encoder                                    # 512..65536 tokens, 3 repeats, 2 threads
    python -m benchmarks.encoder --lengths 512 2048 --repeats 1     # a quick check
    python -m benchmarks.encoder --lengths 16384 65536 --models Fastformer floor FNet
    python -m benchmarks.encoder --report                           # docs/ENCODER.md from docs/encoder.csv
"""

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
    arguments,
    calls_to_fill,
    csv_report,
    log_log,
    memory_available_gb,
    peak_megabytes,
    plt,
    random_ids,
    report_start,
    save_figure,
    seconds_per_call,
    table,
    write_measurements,
)
from benchmarks.specs import ENCODER_RATIOS
from fastformer import FastformerConfig, FastformerModel
from fastformer.modeling_fastformer import FastformerEmbeddings, FastformerLayer

MAX_LENGTH = 65536
TARGET_SECONDS = 0.5  # per measurement, when --iterations is not given


class FloorEncoder(nn.Module):
    """The plain formulation's Linear and LayerNorm work with the additive-attention math removed.

    Each layer runs the query, key, value and transform (W_r) Linear layers of FastformerAttention, with
    u = key + value in place of the two additive poolings (the sum keeps the key's Linear in the backward pass),
    keeps the query residual, then attention_output and feed_forward as FastformerLayer does. No implementation
    that runs these Linear layers can beat it; the collapsed path folds the first five into one, so it can.
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
    parser = arguments(__doc__, threads=2, repeats=3, report="only rewrite --markdown from --csv and its .json")
    parser.add_argument("--lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--models", nargs="+", choices=list(BUILDERS), default=list(BUILDERS))
    parser.add_argument("--iterations", type=int, default=None, help="calls per measurement (default: ~0.5 s)")
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--intermediate-size", type=int, default=1024)
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--max-seconds", type=float, default=60.0, help="skip a model predicted slower per "
                        "forward+backward")  # fmt: skip
    parser.add_argument("--max-memory-gb", type=float, default=round(0.6 * memory_available_gb(), 1),
                        help="skip a model predicted to need more for forward+backward (default: 60%% of the memory "
                        "available now)")  # fmt: skip
    parser.add_argument("--attention-window", type=int, default=256, help="Longformer's")
    parser.add_argument("--block-size", type=int, default=64, help="BigBird's")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", type=Path, default=DOCS / "encoder.csv", help="every measurement")
    parser.add_argument("--markdown", type=Path, default=DOCS / "ENCODER.md", help="the report")
    parser.add_argument("--plots", type=Path, default=DOCS, help="folder for encoder_time.png, encoder_memory.png")
    args = parser.parse_args(argv)
    args.lengths = sorted(set(args.lengths))
    if not 1 <= args.lengths[0] <= args.lengths[-1] <= MAX_LENGTH:
        parser.error(f"lengths must lie in 1..{MAX_LENGTH}")
    if "Fastformer" not in args.models:
        parser.error("the report compares every model with Fastformer: keep it in --models")
    return args


def bert_like(args, heads=True) -> dict:
    """The size settings the BERT, FNet (no heads), Longformer and BigBird configs share."""
    settings = dict(vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
                    intermediate_size=args.intermediate_size, hidden_dropout_prob=0.0,
                    max_position_embeddings=args.lengths[-1], type_vocab_size=1)  # fmt: skip
    return {**settings, "num_attention_heads": args.heads, "attention_probs_dropout_prob": 0.0} if heads else settings


def fastformer_config(args, additive_attention_mode="collapsed") -> FastformerConfig:
    return FastformerConfig(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, intermediate_size=args.intermediate_size, share_layers=False,
        share_query_value=False, hidden_dropout_prob=0.0, max_position_embeddings=args.lengths[-1],
        additive_attention_mode=additive_attention_mode,
    )  # fmt: skip


def hidden_states_of(model):
    """`model` (a transformers encoder without its pooler) and its `(input_ids) -> last hidden states` callable."""
    return model, lambda input_ids: model(input_ids=input_ids).last_hidden_state


def build_fastformer(args, additive_attention_mode="collapsed"):
    config = fastformer_config(args, additive_attention_mode)
    return hidden_states_of(FastformerModel(config, add_pooling_layer=False))


def build_floor(args):
    model = FloorEncoder(fastformer_config(args))
    return model, model


def build_bert(args):
    config = BertConfig(**bert_like(args), attn_implementation="sdpa")
    return hidden_states_of(BertModel(config, add_pooling_layer=False))


def build_fnet(args):
    return hidden_states_of(FNetModel(FNetConfig(**bert_like(args, heads=False)), add_pooling_layer=False))


def build_longformer(args):
    settings = bert_like(args)
    settings["max_position_embeddings"] += 2  # RoBERTa-style positions start after the padding index 1
    config = LongformerConfig(**settings, attention_window=args.attention_window)
    return hidden_states_of(LongformerModel(config, add_pooling_layer=False))


def build_bigbird(args):
    config = BigBirdConfig(**bert_like(args), attention_type="block_sparse", block_size=args.block_size)
    model = BigBirdModel(config, add_pooling_layer=False)

    def call(input_ids):
        # BigBird switches itself to full attention for good after one short input; switch back for long ones
        if model.attention_type != "block_sparse":
            model.set_attention_type("block_sparse")
        return model(input_ids=input_ids).last_hidden_state

    return model, call


def build_fast_transformer(args):
    from fast_transformer_pytorch import FastTransformer  # noqa: PLC0415  (the [bench] extra, this model only)

    model = FastTransformer(num_tokens=args.vocab_size, dim=args.hidden_size, depth=args.layers,
                            max_seq_len=args.lengths[-1], heads=args.heads, dim_head=args.hidden_size // args.heads,
                            ff_mult=args.intermediate_size // args.hidden_size, absolute_pos_emb=True)  # fmt: skip
    model.to_logits = model.to_logits[0]  # its final LayerNorm, without the vocabulary projection
    return model, lambda input_ids: model(input_ids, mask=torch.ones_like(input_ids, dtype=torch.bool))  # None crashes


BUILDERS = {
    "Fastformer": build_fastformer,
    "Fastformer-plain": lambda args: build_fastformer(args, additive_attention_mode="plain"),
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
    input_ids = random_ids(length, args.vocab_size)
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
        input_ids = random_ids(length, args.vocab_size)
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
    title = "# Encoder: forward time, forward+backward time and peak memory against sequence length"
    start, parameters = report_start(title, record)
    return [
        *start,
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


def tables(record, rows) -> list[str]:
    """The header; per measure, model x length medians; the ratios per length; what was not run."""
    median, names = medians(rows)
    lengths = record["settings"]["lengths"]

    def cell(column, name, length):
        value = median.get((column, name, length))
        return "not run" if value is None else f"{value:.{1 if column == 'peak_mb' else 2}f}"

    lines = header(record)
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


def report(csv_path: Path, markdown: Path) -> str:
    return csv_report(csv_path, markdown, tables)


def plot(rows, args):
    """Log-log time against length (forward, forward+backward) and peak memory against length."""
    median, names = medians(rows)

    def lines(column):
        return {name: [(n, median[column, name, n]) for n in args.lengths if (column, name, n) in median]
                for name in names}  # fmt: skip

    figure, axes = plt.subplots(1, 2, figsize=(12, 5))
    for axis, column, title in zip(axes, ("forward_ms", "forward_backward_ms"), ("forward", "forward+backward")):
        log_log(axis, lines(column), args.lengths, "sequence length", "ms", title)
    axes[0].legend()
    save_figure(figure, args.plots / "encoder_time.png")
    figure, axis = plt.subplots(figsize=(6, 5))
    log_log(axis, lines("peak_mb"), args.lengths, "sequence length", "MB", "peak memory, forward+backward")
    axis.legend()
    save_figure(figure, args.plots / "encoder_memory.png")


SETTINGS = ("hidden_size", "layers", "heads", "intermediate_size", "vocab_size", "lengths", "attention_window",
            "block_size", "repeats", "threads")  # fmt: skip


def run(args):
    """Measure, then write the CSV (and its .json), the markdown report and the plots."""
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()  # BigBird's warning at every short input
    models = {name: build(name, args) for name in args.models}
    start = time.perf_counter()
    rows = measure(models, args)
    parameters = {name: model for name, (model, _) in models.items()}
    write_measurements(args.csv, rows, args, SETTINGS, parameters, time.perf_counter() - start)
    print(report(args.csv, args.markdown))
    plot(rows, args)


if __name__ == "__main__":
    args = parse_args()
    report(args.csv, args.markdown) if args.report else run(args)
