"""The whole performance suite in one command: the encoder and decoding benchmarks, then the targets checked.

Runs benchmarks.encoder and benchmarks.decoding, each writing its report, CSV and plots to --docs, then writes
PERFORMANCE.md there: every target of the performance issue (specs) with the ratio this run measured and whether it
holds. Nothing is asserted: a target that does not hold is reported as such.

Usage:
    pip install -e ".[bench]"
    python -m benchmarks.suite                        # the full suite, 37 minutes on 2 CPU cores
    python -m benchmarks.suite --encoder-lengths 512 2048 --decoding-lengths 64 256 --repeats 1   # quick
    python -m benchmarks.suite --report               # the three reports from the CSVs and .json in --docs
"""

import operator
import statistics
import time
from pathlib import Path

from benchmarks import decoding, encoder
from benchmarks.harness import DOCS, arguments, flags, read_csv, read_json, run_lines, table, write_json
from benchmarks.specs import DECODING_CACHE, DECODING_FASTER, DECODING_FLAT, ENCODER_MEASURES, ENCODER_TARGETS


def parse_args(argv=None):
    parser = arguments(__doc__, threads=2, repeats=3, report="only rewrite the reports from the records in --docs")
    parser.add_argument("--encoder-lengths", type=int, nargs="+", default=[2**k for k in range(9, 17)])
    parser.add_argument("--decoding-lengths", type=int, nargs="+", default=[2**k for k in range(6, 14)])
    parser.add_argument("--generate-tokens", type=int, default=64, help="as benchmarks.decoding's")
    parser.add_argument("--models", nargs="+", choices=list(encoder.BUILDERS), default=list(encoder.BUILDERS))
    parser.add_argument("--max-seconds", type=float, default=60.0, help="as benchmarks.encoder's")
    parser.add_argument("--max-memory-gb", type=float, default=None, help="as benchmarks.encoder's")
    parser.add_argument("--docs", type=Path, default=DOCS, help="where the reports, CSVs and plots go")
    return parser.parse_args(argv)


def encoder_args(args):
    return encoder.parse_args(flags({
        "lengths": args.encoder_lengths, "models": args.models, "repeats": args.repeats, "threads": args.threads,
        "max-seconds": args.max_seconds, "max-memory-gb": args.max_memory_gb, "csv": args.docs / "encoder.csv",
        "markdown": args.docs / "ENCODER.md", "plots": args.docs,
    }))  # fmt: skip


def decoding_args(args):
    return decoding.parse_args(flags({
        "lengths": args.decoding_lengths, "generate-tokens": args.generate_tokens, "repeats": args.repeats,
        "threads": args.threads,
        "csv": args.docs / "decoding.csv", "markdown": args.docs / "DECODING.md", "plot": args.docs / "decoding.png",
    }))  # fmt: skip


COMPARE = {"<=": operator.le, ">=": operator.ge, ">": operator.gt, "==": operator.eq}


def check(what, numerator, denominator, required) -> list[str]:
    """The table row of a target: what, the measured ratio, the required one, whether it holds."""
    if numerator is None or denominator is None:
        return [what, "not measured", required, "-"]
    value = numerator / denominator
    comparison, bound = required.split()
    return [what, f"{value:.2f}", required, "yes" if COMPARE[comparison](value, float(bound)) else "**no**"]


def targets(encoded, decoded, cache, generate_ms) -> list[list[str]]:
    """Every target (specs) with the value measured (`generate_ms`: the decoding record's generate() timings)."""
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
    if generate_ms:  # decoding records from before generate() was timed have none
        through = {name: statistics.median(values) for name, values in generate_ms.items()}
        rows.append(check("decoding through generate() (greedy, encoder pass included): BART / Fastformer ms/token",
                          through["BART"], through["Fastformer"], DECODING_FASTER))  # fmt: skip
    return rows


def report(docs: Path) -> str:
    """PERFORMANCE.md from the encoder's and the decoding's records in `docs` and the suite's own (its header)."""
    encoded, _ = encoder.medians(read_csv(docs / "encoder.csv"))
    decoded, cache, _ = decoding.medians(read_csv(docs / "decoding.csv"))
    suite, decoding_record = read_json(docs / "performance.json"), read_json(docs / "decoding.json")
    details = ("- Details: [ENCODER.md](ENCODER.md) (encoder_time.png, encoder_memory.png, encoder.csv) and "
               "[DECODING.md](DECODING.md) (decoding.png, decoding.csv), written by the same run.")  # fmt: skip
    commands = [record["header"][0].split("`")[1] for record in (suite, decoding_record)]  # "- Command: `...` (..)"
    if commands[0] != commands[1]:  # the decoding benchmark was run again on its own
        details = details.replace(", written by the same run.", "; the decoding rows are from a later run of "
                                  "its own:\n" + "\n".join("  " + line for line in decoding_record["header"]))
    lines = [
        "# Performance targets, measured",
        "",
        *suite["header"],
        details,
        "",
        *table(["target", "measured", "required", "holds"],
               targets(encoded, decoded, cache, decoding_record.get("generate_ms_per_token"))),
    ]  # fmt: skip
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
        write_json(args.docs / "performance.json", {"header": run_lines(args.threads, time.perf_counter() - start)})
    text = report(args.docs)
    print(text)
    (args.docs / "PERFORMANCE.md").write_text(text)


if __name__ == "__main__":
    main()
