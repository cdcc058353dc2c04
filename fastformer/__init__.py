"""Fastformer (Wu et al., 2021) for Hugging Face transformers.

Importing the package registers the model with transformers' Auto classes.
"""

import transformers

from . import configuration_fastformer, copy_encoder_decoder, modeling_fastformer  # noqa: F401  (registers)
from .configuration_fastformer import *  # noqa: F403  (its __all__)
from .modeling_fastformer import *  # noqa: F403  (its __all__)

__version__ = "0.1.0"
__all__ = [*configuration_fastformer.__all__, *modeling_fastformer.__all__]

_config_class = configuration_fastformer.FastformerConfig
transformers.AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
for _model_class, _auto_class in modeling_fastformer.AUTO_CLASSES.items():
    getattr(transformers, _auto_class).register(_config_class, _model_class, exist_ok=True)
