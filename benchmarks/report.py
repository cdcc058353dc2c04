"""What every benchmark report states first, so that a reader can rerun it: the command, the date, the machine."""

import datetime
import os
import platform
import shlex
import sys
from pathlib import Path

import torch
import transformers


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
