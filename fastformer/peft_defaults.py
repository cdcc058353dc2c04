"""PEFT's defaults for Fastformer: the modules LoRA adapts when `target_modules` is not given.

PEFT looks a model's `model_type` up in its own tables of default targets and refuses a type it does not know
("Please specify `target_modules`"). Registering "fastformer" there gives `get_peft_model(model,
LoraConfig(task_type=...))` the same targets as for BERT: the attention's `query` and `value` projections (with
the paper's query-value sharing, `share_query_value=True`, the values are the queries, so `query` alone adapts
both), in the encoder, the decoder and the cross-attention. `import fastformer` registers them, once; a checkpoint
loaded as Hub code without the package needs `target_modules`. Does nothing where PEFT is not installed.
"""

import importlib.util

TARGET_MODULES = ["query", "value"]


def register_peft_defaults():
    """Adds "fastformer" to every PEFT table of default targets that gives BERT `TARGET_MODULES` (LoRA and the
    methods that share its table: AdaLoRA, LoHa, LoKr, VeRA, ...)."""
    if importlib.util.find_spec("peft") is None:
        return
    from peft.utils import constants  # noqa: PLC0415  (optional: the [peft] extra)

    for name, table in vars(constants).items():
        if name.endswith("_TARGET_MODULES_MAPPING") and table.get("bert") == TARGET_MODULES:
            table.setdefault("fastformer", list(TARGET_MODULES))
