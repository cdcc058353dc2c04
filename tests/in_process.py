"""A script run in the test's own process, as the interpreter would run it: seconds faster than a new interpreter,
which would import torch and transformers again."""

import contextlib
import importlib.util
import io
import logging
import runpy
import subprocess
import sys
from unittest import mock


def run_in_process(command: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    """`command` (python, then a script's path or -m and a module, then their arguments) run as __main__ with that
    command line; its exit status (a `sys.exit(message)` prints the message), standard output and error,
    transformers' log included. `env` is accepted for the signature of `benchmarks.harness.run` and must be empty."""
    if env:
        raise ValueError(f"env={env!r}: a script run in this process shares its environment")
    module = command[1] == "-m"
    argv = list(map(str, command[2:] if module else command[1:]))
    stdout, stderr = io.StringIO(), io.StringIO()
    log_handler = logging.StreamHandler(stderr)
    transformers_log = logging.getLogger("transformers")
    transformers_log.addHandler(log_handler)
    try:
        with (
            mock.patch.object(sys, "argv", argv),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
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
