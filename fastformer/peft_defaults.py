"""PEFT's default target modules for "fastformer" (which PEFT needs without `target_modules`): BERT's, the attention's
`query` and `value` projections (with `share_query_value=True`, `query` serves both). Nothing without PEFT."""

import importlib.util

TARGET_MODULES = ["query", "value"]


def register_peft_defaults():
    """Adds "fastformer" to every PEFT table of default targets (LoRA, ...) that gives BERT `TARGET_MODULES`."""
    if importlib.util.find_spec("peft") is None:
        return
    from peft.utils import constants  # noqa: PLC0415  (optional: the [peft] extra)

    for name, table in vars(constants).items():
        if name.endswith("_TARGET_MODULES_MAPPING") and table.get("bert") == TARGET_MODULES:
            table.setdefault("fastformer", list(TARGET_MODULES))
