"""What a saved Fastformer folder holds beyond transformers' defaults, and what loading one checks.

- `auto_map` names every head (transformers writes the saved class only), so one checkpoint loads into any Auto
  class as Hub code (trust_remote_code=True) without this package installed.
- An encoder-decoder declares its summarization pipeline (`custom_pipelines`): transformers 5 has none of its own.
- The SHA-256 of every weights file is recorded when it is saved and compared when a local folder is loaded:
  safetensors notices a broken header or a short file, not changed tensor bytes.

`CheckpointMixin` adds these to `save_pretrained` / `from_pretrained`; the models inherit it through
`FastformerPreTrainedModel`. Relative imports only, so a saved checkpoint carries this file as Hub code.
"""

import hashlib
import json
from pathlib import Path

from .pipeline_fastformer import SummarizationPipeline

CHECKSUMS_NAME = "weights_sha256.json"  # written next to the weights by save_pretrained, checked by from_pretrained


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(2**24), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksums(folder):
    """Record the SHA-256 of every weights file in `folder` (CHECKSUMS_NAME)."""
    folder = Path(folder)
    checksums = {path.name: _sha256(path) for path in sorted(folder.glob("*.safetensors"))}
    (folder / CHECKSUMS_NAME).write_text(json.dumps(checksums, indent=2) + "\n")


def verify_checksums(folder):
    """Raise ValueError if a weights file in `folder` differs from the SHA-256 recorded when it was saved."""
    record = Path(folder) / CHECKSUMS_NAME
    if not record.exists():  # saved by another library or by hand: nothing to compare with
        return
    for name, expected in json.loads(record.read_text()).items():
        path = Path(folder) / name
        if path.exists() and _sha256(path) != expected:
            raise ValueError(
                f"{path} does not match the SHA-256 recorded when it was saved ({CHECKSUMS_NAME}): the file is "
                f"corrupted or was changed after saving. Restore it (copy or download it again); if you replaced "
                f"it on purpose, delete {record}."
            )


def _code_name(obj) -> str:
    """"file.Name", as `auto_map` and `custom_pipelines` refer to Hub code."""
    return f"{obj.__module__.rsplit('.', 1)[-1]}.{obj.__name__}"


def _registered_heads(root: type) -> list[type]:
    """`root` and its subclasses that were registered for an Auto class (`register_for_auto_class`)."""
    found, pending = [], [root]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if "_auto_class" in vars(cls) and cls._auto_class is not None:
            found.append(cls)
    return sorted(found, key=lambda cls: cls.__name__)


class CheckpointMixin:
    """For the model family's base class (first in its bases, before `PreTrainedModel`)."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        root = next(cls for cls in type(self).__mro__ if CheckpointMixin in cls.__bases__)
        self.config.auto_map = {
            "AutoConfig": _code_name(type(self.config)),
            **{cls._auto_class: _code_name(cls) for cls in _registered_heads(root)},
        }
        if self.config.is_encoder_decoder:
            self.config.custom_pipelines = {
                "summarization": {"impl": _code_name(SummarizationPipeline), "pt": ["AutoModelForSeq2SeqLM"],
                                  "type": "text"}  # fmt: skip
            }
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if kwargs.get("is_main_process", True):
            write_checksums(save_directory)
        return result

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        # a local folder: compare the SHA-256 recorded at saving (the Hub client checks what it downloads)
        if pretrained_model_name_or_path is not None:
            folder = Path(pretrained_model_name_or_path) / kwargs.get("subfolder", "")
            if folder.is_dir():
                verify_checksums(folder)
        return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
