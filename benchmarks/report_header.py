"""What every benchmark report states first, so that a reader can rerun it: the command, the date, the machine."""

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import matplotlib
import torch
import transformers

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402, F401  (after choosing the backend; the benchmarks plot with it)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def run_lines(threads: int, elapsed: float) -> list[str]:
    """Markdown bullets: the exact command and its run time, the date, the machine and the versions."""
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- Command: `{shlex.join(['python', *sys.argv])}` ({elapsed / 60:.1f} min)",
        f"- Date: {datetime.datetime.now().astimezone().isoformat(timespec='minutes')}",
        f"- Machine: {cpu_name()}, nproc {nproc}, torch threads {threads}, {platform.platform()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}, transformers {transformers.__version__}",
    ]


def memory_available_gb() -> float:
    """MemAvailable from /proc/meminfo (Linux), in GB; 8 where it cannot be read."""
    meminfo = Path("/proc/meminfo")
    if not meminfo.exists():
        return 8.0
    kib = int(next(line.split()[1] for line in meminfo.read_text().splitlines() if line.startswith("MemAvailable")))
    return kib / 2**20


def label_lengths(axis, lengths):
    """The measured lengths as the log x axis's only labels."""
    axis.set_xticks(lengths, labels=map(str, lengths))
    axis.tick_params(axis="x", which="minor", labelbottom=False)
