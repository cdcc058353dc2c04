"""PEFT's defaults for Fastformer: the modules LoRA adapts when `target_modules` is not given.

PEFT refuses a `model_type` missing from its tables of default targets. `import fastformer` registers "fastformer"
there with BERT's targets, the attention's `query` and `value` projections (with `share_query_value=True`, `query`
adapts both), in the encoder, the decoder and the cross-attention. Does nothing where PEFT is not installed.
"""

import importlib.util

TARGET_MODULES = ["query", "value"]


def register_peft_defaults():
    """Adds "fastformer" to every PEFT table of default targets that gives BERT `TARGET_MODULES` (LoRA, AdaLoRA,
    LoHa, LoKr, VeRA, ...)."""
    if importlib.util.find_spec("peft") is None:
        return
    from peft.utils import constants  # noqa: PLC0415  (optional: the [peft] extra)

    for name, table in vars(constants).items():
        if name.endswith("_TARGET_MODULES_MAPPING") and table.get("bert") == TARGET_MODULES:
            table.setdefault("fastformer", list(TARGET_MODULES))
