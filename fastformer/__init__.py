"""Fastformer (Wu et al., 2021) for Hugging Face transformers.

Importing the package registers the model with the Auto classes (and PEFT's default adapter targets).
"""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from .configuration_fastformer import FastformerConfig
from .modeling_fastformer import (
    FastformerCache,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
    FastformerPreTrainedModel,
)
from .peft_defaults import register_peft_defaults

__version__ = "0.1.0"

AutoConfig.register(FastformerConfig.model_type, FastformerConfig, exist_ok=True)
AutoModel.register(FastformerConfig, FastformerModel, exist_ok=True)
AutoModelForSequenceClassification.register(FastformerConfig, FastformerForSequenceClassification, exist_ok=True)
AutoModelForMaskedLM.register(FastformerConfig, FastformerForMaskedLM, exist_ok=True)
AutoModelForSeq2SeqLM.register(FastformerConfig, FastformerForConditionalGeneration, exist_ok=True)
AutoModelForCausalLM.register(FastformerConfig, FastformerForCausalLM, exist_ok=True)
register_peft_defaults()

__all__ = [
    "FastformerCache",
    "FastformerConfig",
    "FastformerForCausalLM",
    "FastformerForConditionalGeneration",
    "FastformerForMaskedLM",
    "FastformerForSequenceClassification",
    "FastformerModel",
    "FastformerPreTrainedModel",
]
