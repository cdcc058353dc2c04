"""Where the encoder's time goes: torch.profiler operator tables for Fastformer (collapsed and plain paths) and
the floor, forward and forward+backward, at one length (the benchmarks' model sizes).

    python -m benchmarks.profile_encoder                     # 16384 tokens, 2 threads -> docs/PROFILE.md
    python -m benchmarks.profile_encoder --length 2048 --rows 8
"""

import time
from pathlib import Path

import torch
from torch.profiler import profile

from benchmarks import encoder
from benchmarks.harness import DOCS, arguments, random_ids, run_lines, table


def parse_args(argv=None):
    parser = arguments(__doc__, threads=2)
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--rows", type=int, default=10, help="operators per table")
    parser.add_argument("--markdown", type=Path, default=DOCS / "PROFILE.md")
    args = parser.parse_args(argv)
    # the model sizes and the rest exactly as benchmarks.encoder builds them
    settings = encoder.parse_args(["--lengths", str(args.length), "--threads", str(args.threads)])
    return args, settings


def operator_table(step, model, call, input_ids, rows) -> list[str]:
    """Self CPU time per operator over one profiled call (after one warm-up call), as a markdown table."""
    step(model, call, input_ids)
    with profile() as profiler:
        step(model, call, input_ids)
    events = sorted(profiler.key_averages(), key=lambda event: event.self_cpu_time_total, reverse=True)
    total = sum(event.self_cpu_time_total for event in events)
    cells = [[event.key, event.count, f"{event.self_cpu_time_total / 1e3:.1f}",
              f"{event.self_cpu_time_total / total:.0%}"] for event in events[:rows]]  # fmt: skip
    return [f"total self CPU time {total / 1e3:.0f} ms", "", *table(["operator", "calls", "self ms", "share"], cells)]


def main():
    args, settings = parse_args()
    torch.set_num_threads(args.threads)
    input_ids = random_ids(args.length, settings.vocab_size)
    start = time.perf_counter()
    sections = []
    for name in ("Fastformer", "Fastformer-plain", "floor"):
        model, call = encoder.build(name, settings)
        for title, step in (("forward", encoder.forward), ("forward+backward", encoder.forward_backward)):
            sections += [f"## {name}, {title}", "", *operator_table(step, model, call, input_ids, args.rows), ""]
    lines = [
        f"# Profile: the encoder at {args.length} tokens",
        "",
        *run_lines(args.threads, time.perf_counter() - start),
        f"- Models as in [ENCODER.md](ENCODER.md): hidden {settings.hidden_size}, {settings.layers} layers, "
        f"{settings.heads} heads, feed-forward {settings.intermediate_size}, batch 1, fp32, eval mode. Self CPU "
        "time per operator (torch.profiler) over one call after a warm-up call; addmm/mm/bmm/baddbmm are the "
        "matrix products, copy_ includes the bias copies of addmm.",
        "",
        *sections,
    ]
    text = "\n".join(lines)
    print(text)
    args.markdown.write_text(text + "\n")


if __name__ == "__main__":
    main()
