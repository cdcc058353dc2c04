"""The whole performance suite in one command: the encoder and decoding benchmarks, then the targets checked.

Runs benchmarks/encoder.py (forward, forward+backward and peak memory against length, Fastformer vs the floor
and its peers) and benchmarks/decoding.py (time per generated token and cache size, Fastformer vs BART), each
writing its report, CSV and plots to --docs, then writes PERFORMANCE.md there: every target of the project's
performance issue with the ratio measured in this run and whether it holds. Nothing is asserted: a target that
does not hold is reported as such.

Usage:
    pip install -e ".[bench]"
    python benchmarks/suite.py                        # the full suite, 37 minutes on 2 CPU cores
    python benchmarks/suite.py --encoder-lengths 512 2048 --decoding-lengths 64 256 --repeats 1   # quick
"""

import argparse
import time
from pathlib import Path

import decoding

import encoder
from report_header import run_lines

DOCS = Path(__file__).resolve().parents[1] / "docs"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder-lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--decoding-lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)])
    parser.add_argument("--models", nargs="+", choices=list(encoder.BUILDERS), default=list(encoder.BUILDERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="as benchmarks/encoder.py")
    parser.add_argument("--max-memory-gb", type=float, default=None, help="as benchmarks/encoder.py")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the reports, CSVs and plots go")
    return parser.parse_args(argv)


def encoder_args(args):
    argv = [
        *("--lengths", *map(str, args.encoder_lengths)),
        *("--models", *args.models),
        *("--repeats", str(args.repeats), "--threads", str(args.threads), "--max-seconds", str(args.max_seconds)),
        *("--csv", str(args.docs / "encoder.csv"), "--markdown", str(args.docs / "ENCODER.md")),
        *("--plots", str(args.docs)),
    ]
    if args.max_memory_gb is not None:
        argv += ["--max-memory-gb", str(args.max_memory_gb)]
    return encoder.parse_args(argv)


def decoding_args(args):
    return decoding.parse_args(
        [
            *("--lengths", *map(str, args.decoding_lengths)),
            *("--repeats", str(args.repeats), "--threads", str(args.threads)),
            *("--csv", str(args.docs / "decoding.csv"), "--markdown", str(args.docs / "DECODING.md")),
            *("--plot", str(args.docs / "decoding.png")),
        ]
    )


# the performance issue's targets: (measure, length, numerator, denominator, required ratio)
ENCODER_TARGETS = [
    ("forward_ms", 16384, "Fastformer", "floor", "<= 1.10"),
    ("forward_ms", 16384, "fast-transformer-pytorch", "Fastformer", ">= 1.15"),
    ("forward_ms", 16384, "BERT", "Fastformer", ">= 6"),
    ("forward_backward_ms", 8192, "Fastformer", "floor", "<= 1.3"),
    ("peak_mb", 8192, "Fastformer", "floor", "<= 1.5"),
]
MEASURES = {"forward_ms": "forward time", "forward_backward_ms": "forward+backward time", "peak_mb": "peak memory"}
COMPARE = {"<=": float.__le__, ">=": float.__ge__, ">": float.__gt__, "==": float.__eq__}


def check(what, numerator, denominator, required) -> tuple[str, float | None, str, bool | None]:
    """(what, measured ratio, required, holds); the ratio and the verdict None when either was not measured."""
    if numerator is None or denominator is None:
        return what, None, required, None
    value = numerator / denominator
    operator, bound = required.split()
    return what, value, required, COMPARE[operator](value, float(bound))


def targets(encoded, decoded, cache) -> list[tuple[str, float | None, str, bool | None]]:
    """Every target with the value this run measured."""
    rows = [
        check(
            f"encoder {MEASURES[measure]} at {n} tokens: {top} / {bottom}",
            encoded.get((measure, top, n)),
            encoded.get((measure, bottom, n)),
            required,
        )  # fmt: skip
        for measure, n, top, bottom, required in ENCODER_TARGETS
    ]
    lengths = sorted(n for name, n in decoded if name == "Fastformer")
    first, last = lengths[0], lengths[-1]
    rows.append(
        check(
            f"decoding: Fastformer ms/token at {last} generated tokens / at {first}",
            decoded["Fastformer", last],
            decoded["Fastformer", first],
            "<= 1.1",
        )  # fmt: skip
    )
    sizes = [cache["Fastformer", n] for n in lengths]
    rows.append(check(f"decoding: Fastformer cache, largest / smallest ({first}..{last} tokens)",
                      max(sizes), min(sizes), "== 1"))  # fmt: skip
    rows += [
        check(
            f"decoding at {n} generated tokens: BART / Fastformer ms/token",
            decoded["BART", n],
            decoded["Fastformer", n],
            ">= 1",  # at least as fast as BART of the same size, from the shortest length on
        )  # fmt: skip
        for n in lengths
    ]
    return rows


def report(rows, args, elapsed) -> str:
    lines = [
        "# Performance targets, measured",
        "",
        *run_lines(args.threads, elapsed),
        "- Details: [ENCODER.md](ENCODER.md) (encoder_time.png, encoder_memory.png, encoder.csv) and "
        "[DECODING.md](DECODING.md) (decoding.png, decoding.csv), written by the same run.",
        "",
        "| target | measured | required | holds |",
        "|---|---|---|---|",
    ]
    for what, value, target, holds in rows:
        shown = "not measured" if value is None else f"{value:.2f}"
        verdict = "-" if holds is None else ("yes" if holds else "**no**")
        lines.append(f"| {what} | {shown} | {target} | {verdict} |")
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    start = time.perf_counter()
    encoded = encoder.run(encoder_args(args))
    decoded, cache = decoding.run(decoding_args(args))
    text = report(targets(encoded, decoded, cache), args, time.perf_counter() - start)
    print(text)
    (args.docs / "PERFORMANCE.md").write_text(text)


if __name__ == "__main__":
    main()
