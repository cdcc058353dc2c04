"""The installed commands (pyproject.toml's [project.scripts]) and helpers they share with the training scripts.

`fastformer-convert` needs the [train] extra, `fastformer-export-onnx` the [onnx] one, `fastformer-push-to-hub` none;
without its extra a command still answers `--help` and stops a run with one line (`require_extra`)."""

import importlib.util
import logging
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import torch
import transformers
from safetensors import SafetensorError, safe_open
from transformers import HfArgumentParser

# the modules the commands import from each extra (pyproject.toml's [project.optional-dependencies])
EXTRAS = {"train": ("datasets", "accelerate"), "onnx": ("onnx", "onnxscript", "onnxruntime")}

logger = logging.getLogger(__name__)


def installed(extra: str) -> bool:
    """Whether every module the commands need from `extra` can be found (not imported: that takes seconds)."""
    return all(importlib.util.find_spec(name) is not None for name in EXTRAS[extra])


def missing_extra_message(command: str, extra: str) -> str:
    return f'{command} needs the "{extra}" extra: pip install "fastformer[{extra}]"'


def require_extra(
    command: str, extra: str, args: list[str] | None = None, print_help: Callable[[], None] | None = None
) -> None:
    """Stop `command` with one line naming `extra` unless it is installed, after answering -h/--help (`print_help`)."""
    if installed(extra):
        return
    if print_help is not None and {"-h", "--help"} & set(sys.argv[1:] if args is None else args):
        print_help()
        raise SystemExit(0)
    raise SystemExit(missing_extra_message(command, extra))


def fail(message: str) -> NoReturn:
    """Stop the program with a one-line message naming the problem (exit status 1)."""
    sys.exit(f"{Path(sys.argv[0]).name}: error: {message}")


def parse_args(arguments: tuple[type, ...], args: list[str] | None = None) -> tuple:
    """The command line (or `args`) as the `arguments` dataclasses, unknown flags refused; a single argument ending
    in .json is an argument file (a JSON object of flags), as in the transformers examples."""
    parser = HfArgumentParser(arguments)
    args = sys.argv[1:] if args is None else args
    if len(args) == 1 and args[0].endswith(".json"):
        if not Path(args[0]).is_file():
            fail(f"argument file {args[0]}: no such file")
        try:
            return parser.parse_json_file(args[0])
        except ValueError as error:  # keys that are no flag of this program, or invalid JSON
            fail(f"argument file {args[0]}: {error}")
    return parser.parse_args_into_dataclasses(args)


def setup_logging(training_args, *loggers: logging.Logger) -> None:
    """Log to stdout at the run's level: the commands', `__main__`'s, `loggers`, transformers' and datasets'."""
    import datasets  # noqa: PLC0415  (the [train] extra)

    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%m/%d/%Y %H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    level = training_args.get_process_log_level()
    for log in (logger, logging.getLogger("__main__"), *loggers):
        log.setLevel(level)
    datasets.utils.logging.set_verbosity(level)
    transformers.utils.logging.set_verbosity(level)
    logger.info(f"Training/evaluation parameters {training_args}")
    warn_emulated_bf16(training_args)


def warn_emulated_bf16(training_args) -> None:
    """Warn about --bf16 on an x86 CPU without AVX512-BF16 or AMX, where torch emulates bf16 (about 2x slower)."""
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()  # torch's (private) checks
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    if training_args.bf16 and training_args.device.type == "cpu" and x86 and not native:
        logger.warning(
            "--bf16 on a CPU without AVX512-BF16 or AMX instructions: bf16 is emulated here and runs slower than "
            'float32 (about 2x a training step); leave --bf16 out (or set "bf16": false) on this machine'
        )


def check_weights_readable(path) -> None:
    """Stop with a message naming the file if the safetensors file `path`, or one in the folder `path`, is damaged."""
    path = Path(path)
    files = sorted(path.glob("*.safetensors")) if path.is_dir() else [path] if path.is_file() else []
    for path in files:
        try:
            safe_open(path, framework="pt").keys()
        except SafetensorError as error:
            fail(f"{path} is damaged (truncated or overwritten: {error}); restore it, or train it again")
