"""The tools installed as commands (pyproject.toml's [project.scripts]); `scripts/` runs the same from a checkout.

- `fastformer-convert`: fastformer/cli/convert_bert_to_fastformer.py (a BERT-family checkpoint as a Fastformer;
  the [train] extra)
- `fastformer-export-onnx`: fastformer/cli/export_onnx.py (an encoder checkpoint as ONNX, checked on ONNX Runtime;
  the [onnx] extra)
- `fastformer-push-to-hub`: fastformer/cli/push_to_hub.py (a finished output folder to the Hub; no extra)

Not imported by `import fastformer`. After a bare `pip install fastformer` each command still imports and answers
`--help`; one whose extra is missing then stops at the start of its `main` with one line naming the extra
(`require_extra`), not a traceback from deep inside.
"""

import importlib.util
import sys
from collections.abc import Callable

# the modules the commands import from each extra (pyproject.toml's [project.optional-dependencies]): the
# conversion's texts (datasets, and fastformer.training) and TrainingArguments (accelerate); torch.onnx.export with
# dynamo=True (onnx, onnxscript) and the check on ONNX Runtime
EXTRAS = {"train": ("datasets", "accelerate"), "onnx": ("onnx", "onnxscript", "onnxruntime")}


def installed(extra: str) -> bool:
    """Whether every module the commands need from `extra` can be imported (found, not imported: that takes
    seconds, and a command imports them itself)."""
    return all(importlib.util.find_spec(name) is not None for name in EXTRAS[extra])


def missing_extra_message(command: str, extra: str) -> str:
    return f'{command} needs the "{extra}" extra: pip install "fastformer[{extra}]"'


def require_extra(
    command: str, extra: str, args: list[str] | None = None, print_help: Callable[[], None] | None = None
) -> None:
    """Stop `command` (exit status 1) with one line naming `extra` unless it is installed. With `print_help`, a
    command line (`args`, default sys.argv[1:]) asking for -h/--help is answered first, as with the extra."""
    if installed(extra):
        return
    if print_help is not None and {"-h", "--help"} & set(sys.argv[1:] if args is None else args):
        print_help()
        raise SystemExit(0)
    raise SystemExit(missing_extra_message(command, extra))
