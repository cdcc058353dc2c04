"""Fastformer (Wu et al., 2021) for Hugging Face transformers.

Importing the package (and only that) registers the configs and heads with the Auto classes and for Hub code
(`auto_map`), as causal LMs for Trainer's label smoothing, and with PEFT's default target modules (`peft_defaults`)."""

import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from . import copy_head, modeling_fastformer
from .checks import value_checks
from .configuration_fastformer import FastformerConfig, FastformerCopyConfig
from .copy_head import *  # noqa: F403  (its __all__)
from .modeling_fastformer import *  # noqa: F403  (its __all__)
from .peft_defaults import register_peft_defaults

__version__ = "0.1.0"
__all__ = ["FastformerConfig", "FastformerCopyConfig", *modeling_fastformer.__all__, *copy_head.__all__]
__all__ += ["value_checks"]

# each config, and each head with its Auto class, as the Hub code's `auto_map` names them
MODULES = {"modeling_fastformer": modeling_fastformer, "copy_head": copy_head}
for _config_class in (FastformerConfig, FastformerCopyConfig):
    _config_class.register_for_auto_class()
    transformers.AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    for _auto_class, _path in _config_class.hub_auto_map().items():
        _module, _, _name = _path.partition(".")
        _model_class = getattr(MODULES.get(_module), _name, None)
        if _model_class is not None and _model_class.config_class is _config_class:
            _model_class.register_for_auto_class(_auto_class)
            getattr(transformers, _auto_class).register(_config_class, _model_class, exist_ok=True)
    # the table Trainer's label smoothing reads to shift a causal LM's labels (`AutoModelForCausalLM.register` does not)
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(_config_class.model_type, "FastformerForCausalLM")
register_peft_defaults()
