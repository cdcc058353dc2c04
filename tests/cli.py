"""A script's `main()` run in the test's own process with a command line, as `python <command>` runs it: the
same parsing, checks, training and files, without the seconds a new interpreter spends on its imports. Tests
whose subject is the process itself (several processes, `accelerate launch`, a fresh environment) start real
ones instead."""

import contextlib
import io
import logging
import subprocess
import sys
from unittest import mock


def run_main(main, command: list[str], *args) -> subprocess.CompletedProcess:
    """`main(*args)` with `sys.argv` = `command` (the script's path, then its arguments): its exit status (a
    `sys.exit(message)` prints the message, as the interpreter does), standard output and error, transformers' log
    included."""
    stdout, stderr = io.StringIO(), io.StringIO()
    log_handler = logging.StreamHandler(stderr)
    transformers_log = logging.getLogger("transformers")
    transformers_log.addHandler(log_handler)
    try:
        with mock.patch.object(sys, "argv", command), contextlib.redirect_stdout(stdout), \
                contextlib.redirect_stderr(stderr):  # fmt: skip
            main(*args)
        status = 0
    except SystemExit as exit_:
        status = exit_.code if isinstance(exit_.code, int) else 1
        if isinstance(exit_.code, str):
            stderr.write(exit_.code + "\n")
    finally:
        transformers_log.removeHandler(log_handler)
    return subprocess.CompletedProcess(command, status, stdout.getvalue(), stderr.getvalue())
