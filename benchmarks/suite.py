"""The whole performance suite in one command: the encoder and decoding benchmarks, then the targets checked.

Runs benchmarks/encoder.py (forward, forward+backward and peak memory against length, Fastformer vs the floor
and its peers) and benchmarks/decoding.py (time per generated token and cache size, Fastformer vs BART), each
writing its report, CSV and plots to --docs, then writes PERFORMANCE.md there: every target of the project's
performance issue with the ratio measured in this run and whether it holds. Nothing is asserted: a target that
does not hold is reported as such.

Usage:
    pip install -e ".[bench]"
    python -m benchmarks.suite                        # the full suite, 37 minutes on 2 CPU cores
    python -m benchmarks.suite --encoder-lengths 512 2048 --decoding-lengths 64 256 --repeats 1   # quick
    python -m benchmarks.suite --report               # the three reports from the CSVs and .json in --docs
"""

import argparse
import json
import operator
import time
from pathlib import Path

from benchmarks import decoding, encoder
from benchmarks.harness import DOCS, read_json, run_lines, table
from benchmarks.specs import DECODING_CACHE, DECODING_FASTER, DECODING_FLAT, ENCODER_MEASURES, ENCODER_TARGETS


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--encoder-lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--decoding-lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)])
    parser.add_argument("--models", nargs="+", choices=list(encoder.BUILDERS), default=list(encoder.BUILDERS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--max-seconds", type=float, default=60.0, help="as benchmarks.encoder's")
    parser.add_argument("--max-memory-gb", type=float, default=None, help="as benchmarks.encoder's")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the reports, CSVs and plots go")
    parser.add_argument("--report", action="store_true", help="only rewrite the reports from the records in --docs")
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


COMPARE = {"<=": operator.le, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


def check(what, numerator, denominator, required) -> tuple[str, float | None, str, bool | None]:
    """(what, measured ratio, required, holds); the ratio and the verdict None when either was not measured."""
    if numerator is None or denominator is None:
        return what, None, required, None
    value = numerator / denominator
    comparison, bound = required.split()
    return what, value, required, COMPARE[comparison](value, float(bound))


def targets(encoded, decoded, cache) -> list[tuple[str, float | None, str, bool | None]]:
    """Every target (specs) with the value this run measured."""
    rows = [
        check(f"encoder {ENCODER_MEASURES[t.measure]} at {t.length} tokens: {t.numerator} / {t.denominator}",
              encoded.get((t.measure, t.numerator, t.length)), encoded.get((t.measure, t.denominator, t.length)),
              t.required)
        for t in ENCODER_TARGETS
    ]  # fmt: skip
    lengths = sorted(n for name, n in decoded if name == "Fastformer")
    first, last = lengths[0], lengths[-1]
    rows.append(check(f"decoding: Fastformer ms/token at {last} generated tokens / at {first}",
                      decoded["Fastformer", last], decoded["Fastformer", first], DECODING_FLAT))  # fmt: skip
    sizes = [cache["Fastformer", n] for n in lengths]
    rows.append(check(f"decoding: Fastformer cache, largest / smallest ({first}..{last} tokens)",
                      max(sizes), min(sizes), DECODING_CACHE))  # fmt: skip
    rows += [check(f"decoding at {n} generated tokens: BART / Fastformer ms/token", decoded["BART", n],
                   decoded["Fastformer", n], DECODING_FASTER) for n in lengths]  # fmt: skip
    return rows


def report(docs: Path) -> str:
    """PERFORMANCE.md from the encoder's and the decoding's records in `docs` and the suite's own (its header)."""
    encoded, _ = encoder.medians(encoder.read_rows(docs / "encoder.csv"))
    decoded, cache, _ = decoding.medians(decoding.read_rows(docs / "decoding.csv"))
    rows = [[what, "not measured" if value is None else f"{value:.2f}", required,
             "-" if holds is None else ("yes" if holds else "**no**")]
            for what, value, required, holds in targets(encoded, decoded, cache)]  # fmt: skip
    lines = [
        "# Performance targets, measured",
        "",
        *read_json(docs / "performance.json")["header"],
        "- Details: [ENCODER.md](ENCODER.md) (encoder_time.png, encoder_memory.png, encoder.csv) and "
        "[DECODING.md](DECODING.md) (decoding.png, decoding.csv), written by the same run.",
        "",
        *table(["target", "measured", "required", "holds"], rows),
    ]
    return "\n".join(lines) + "\n"


def main():
    args = parse_args()
    if args.report:
        encoder.report(args.docs / "encoder.csv", args.docs / "ENCODER.md")
        decoding.report(args.docs / "decoding.csv", args.docs / "DECODING.md")
    else:
        start = time.perf_counter()
        encoder.run(encoder_args(args))
        decoding.run(decoding_args(args))
        header = run_lines(args.threads, time.perf_counter() - start)
        (args.docs / "performance.json").write_text(json.dumps({"header": header}, indent=1) + "\n")
    text = report(args.docs)
    print(text)
    (args.docs / "PERFORMANCE.md").write_text(text)


if __name__ == "__main__":
    main()
