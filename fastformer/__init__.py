"""Fastformer (Wu et al., 2021) for Hugging Face transformers.

Importing the package registers Fastformer once, here, and nowhere else (building a model changes no global state):
- with transformers' Auto classes: the config as model type "fastformer", each head with its Auto class (and the
  copy head's config as "fastformer_copy"), and every class `register_for_auto_class`, so that
  `save_pretrained` writes `auto_map` and copies the code for `trust_remote_code=True`;
- in transformers' table of causal LMs (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`), the one Trainer's label smoothing reads
  to shift a causal LM's labels (`AutoModelForCausalLM.register` leaves it alone);
- in PEFT's tables of default target modules, where PEFT is installed (`peft_defaults`).
A checkpoint loaded as Hub code without this package gets the Auto classes from transformers itself, but not the
last two: pass `target_modules` to PEFT there, and Trainer's label smoothing does not shift its causal LM's labels.
"""

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
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(_config_class.model_type, "FastformerForCausalLM")
register_peft_defaults()
