"""Fastformer configuration: a typed `@strict` dataclass, as transformers' own configs."""

import copy
import os
from typing import Literal

from huggingface_hub.dataclasses import strict, validated_field
from transformers import PreTrainedConfig
from transformers.activations import ACT2FN
from transformers.dynamic_module_utils import custom_object_save
from transformers.utils import logging

from .functional import INTERACTIONS

logger = logging.get_logger(__name__)

TYPE_VOCAB_SIZE = 2  # token types (segments), as BERT's: a text or a pair


def _requires(requirement: str, holds):
    """A field factory (`name: int = _positive_int(default)`) whose values must pass `holds` (None is left to the
    annotation); `requirement` words the rule in the error, which `@strict` prefixes with the field's name."""

    def check(value):
        if value is not None and not holds(value):
            raise ValueError(f"must be {requirement}, got {value!r}")

    return lambda default: validated_field(check, default=default)


_positive_int = _requires("a positive integer", lambda value: value >= 1)
_positive_number = _requires("a positive number", lambda value: value > 0)
_probability = _requires("a number in [0, 1)", lambda value: 0 <= value < 1)
_count = _requires("0 (none) or a positive integer", lambda value: value >= 0)
_convolution_kernel = _requires("0 (none) or a kernel of at least 2 tokens", lambda value: value == 0 or value >= 2)
_activation = _requires(f"one of {tuple(sorted(ACT2FN))}", lambda value: value in ACT2FN)


# the Hub code names of the config and the heads, as `auto_map` and `custom_pipelines` write them ("file.Class")
AUTO_MAP = {
    "AutoConfig": "configuration_fastformer.FastformerConfig",
    "AutoModel": "modeling_fastformer.FastformerModel",
    "AutoModelForSequenceClassification": "modeling_fastformer.FastformerForSequenceClassification",
    "AutoModelForMaskedLM": "modeling_fastformer.FastformerForMaskedLM",
    "AutoModelForSeq2SeqLM": "modeling_fastformer.FastformerForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_fastformer.FastformerForCausalLM",
}
SUMMARIZATION_PIPELINE = {
    "summarization": {
        "impl": "pipeline_fastformer.SummarizationPipeline",
        "pt": ["AutoModelForSeq2SeqLM"],
        "type": "text",
    }
}


COPY_AUTO_MAP = {
    "AutoConfig": "configuration_fastformer.FastformerCopyConfig",
    "AutoModelForSeq2SeqLM": "copy_head.FastformerCopyForConditionalGeneration",
    "AutoModelForCausalLM": "copy_head.FastformerCopyForCausalLM",
}
# retired fields, dropped with a warning; COPY_FIELDS (`FastformerCopyConfig`'s) with the values that leave them out
COPY_FIELDS = {"copy_mechanism": False, "copy_spans": False, "copy_context_window": 0, "decoder_conv_kernel": 0}
RETIRED_FIELDS = ("additive_attention_mode", "classifier_dropout", "type_vocab_size", *COPY_FIELDS)


def check_copy_context_window(window: int):
    """Refuses a `copy_context_window` that is neither 0 nor an odd window of at least 3 tokens."""
    if window != 0 and (window < 3 or window % 2 == 0):
        raise ValueError(
            f"`copy_context_window` must be 0 (none) or an odd window of at least 3 tokens centred on each one, got "
            f"{window}"
        )


@strict
class FastformerConfig(PreTrainedConfig):
    r"""Configuration of Fastformer (Wu et al., 2021, arXiv:2108.09084): the encoder and its generative models.

    The defaults are the paper's classification model: hidden size 256, 16 heads, 2 layers, dropout 0.2, product
    interaction, query-value and layer-wise sharing, additive-attention pooling. A bad value raises `@strict`'s
    `StrictDataclassFieldValidationError` (at construction or assignment); fields that do not fit together raise its
    `StrictDataclassClassValidationError` (at construction, `validate()` and `save_pretrained`).

    Args:
        vocab_size (`int`, defaults to 30522): number of token ids (bert-base-uncased WordPiece).
        hidden_size (`int`, defaults to 256): width of the token representations.
        embedding_size (`int`, *optional*): width of the word and position embeddings, projected to `hidden_size`
            where it differs (as ELECTRA's); `hidden_size` if None. Generative models need it equal to `hidden_size`.
        num_hidden_layers (`int`, defaults to 2): number of Fastformer layers applied.
        num_attention_heads (`int`, defaults to 16): heads; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 1024): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation, a key of `transformers.activations.ACT2FN`.
        hidden_dropout_prob (`float`, defaults to 0.2): dropout on embeddings and on each sub-layer's output.
        max_position_embeddings (`int`, defaults to 2048): longest input; positions are learned embeddings.
        layer_norm_eps (`float`, defaults to 1e-12): LayerNorm epsilon.
        initializer_range (`float`, defaults to 0.02): std of the normal init of every weight matrix and of w_q, w_k.
        pad_token_id (`int`, defaults to 0): padding id (its embedding starts at zero).
        tie_word_embeddings (`bool`, defaults to True): the masked-LM output matrix is the input embedding matrix.
        share_query_value (`bool`, defaults to True): query-value sharing (RQ3): W_v = W_q, so the layer has no W_v.
        share_layers (`bool`, defaults to True): layer-wise sharing (RQ3): one layer applied `num_hidden_layers` times.
        share_heads (`bool`, defaults to False): head-wise sharing (RQ3): all heads share w_q and w_k (and the
            `"concat"` projections), Fastformer's only per-head parameters. The paper found it hurts.
        interaction (`str`, defaults to `"product"`): how a global vector meets each token (RQ2): `"product"`
            (p_i = q * k_i, u_i = k * v_i), `"add"` (q + k_i, k + v_i) or `"concat"` ([q; k_i] P, with a learned
            projection P of shape (2 * head_dim, head_dim) per head and interaction).
        query_residual (`bool`, defaults to True): the paper's query residual, attention output r_i + q_i; False
            gives r_i alone, as a softmax Transformer (and models converted from BERT: `fastformer.conversion`).
        chunk_size_feed_forward (`int`, defaults to 0, `PreTrainedConfig`'s field): feed-forward blocks run on at most
            this many tokens at a time (0: all at once); the same result, less activation memory without gradients.
        pooler_type (`str`, defaults to `"additive"`): how `FastformerModel` pools the last layer into `pooler_output`:
            `"additive"` (the paper's attention pooling), `"cls"` (the first real token), `"mean"` (of real tokens),
            or `"cls_tanh"`, `"cls_relu"`, `"cls_gelu"` (the first real token through a dense layer and activation).
        cls_attention_heads (`int`, defaults to 0): if positive, in the encoder's last layer the first real token (a
            classifier's [CLS]) attends to every token by softmax attention in this many heads, through the layer's
            weights (as the BERT layer a classifier converts from; Longformer's global attention on [CLS]). One query:
            the cost stays linear in the length. 0: every token attends additively (the paper).

    Generation (`FastformerForConditionalGeneration`, `FastformerForCausalLM`):
        num_decoder_layers (`int`, *optional*): causal layers, with the encoder's switches; `num_hidden_layers` if None.
        cross_attention_type (`str`, defaults to `"softmax"`): how decoder tokens read the encoder output: `"softmax"`
            (multi-head scaled dot-product attention, caching the encoder's keys and values) or `"additive"` (one
            context per head, c = sum_j softmax_j(w_c . v_j / sqrt(d)) v_j, then c * q_t: O(1) per generated token).
        tie_encoder_embeddings (`bool`, defaults to True): the encoder shares the decoder's word embeddings.
        bos_token_id, decoder_start_token_id (`int`, *optional*): special ids for generation.
        eos_token_id (`int` or `list[int]`, *optional*): the id, or ids, that end a generated sequence.
        use_cache (`bool`, defaults to True): return the decoder's generation state (`FastformerCacheLayer`s).
    """

    model_type = "fastformer"

    vocab_size: int = _positive_int(30522)
    hidden_size: int = _positive_int(256)
    embedding_size: int | None = _positive_int(None)
    num_hidden_layers: int = _positive_int(2)
    num_attention_heads: int = _positive_int(16)
    intermediate_size: int = _positive_int(1024)
    hidden_act: str = _activation("gelu")
    hidden_dropout_prob: float | int = _probability(0.2)
    max_position_embeddings: int = _positive_int(2048)
    layer_norm_eps: float | int = _positive_number(1e-12)
    initializer_range: float | int = _positive_number(0.02)
    pad_token_id: int | None = 0
    tie_word_embeddings: bool = True
    share_query_value: bool = True
    share_layers: bool = True
    share_heads: bool = False
    interaction: Literal[INTERACTIONS] = "product"  # the tuple of functional.py, the one list of interactions
    query_residual: bool = True
    pooler_type: Literal["additive", "cls", "mean", "cls_tanh", "cls_relu", "cls_gelu"] = "additive"
    cls_attention_heads: int = _count(0)
    num_decoder_layers: int | None = _positive_int(None)
    cross_attention_type: Literal["softmax", "additive"] = "softmax"
    tie_encoder_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # the class's (an older copy-head config names "fastformer")
        self.drop_retired_fields(kwargs)
        if self.num_decoder_layers is None:  # as T5: the decoder mirrors the encoder
            self.num_decoder_layers = self.num_hidden_layers
        super().__post_init__(**kwargs)

    def drop_retired_fields(self, kwargs: dict):
        """Takes `RETIRED_FIELDS` out of `kwargs` with a warning; a copy-head value that changes outputs is refused
        (it is `FastformerCopyConfig`'s, which `from_dict` loads such a config as)."""
        retired = {name: kwargs.pop(name) for name in RETIRED_FIELDS if name in kwargs}
        if not retired:
            return
        if not isinstance(self, FastformerCopyConfig):
            for name, value in retired.items():
                if name == "type_vocab_size" and value > TYPE_VOCAB_SIZE:
                    raise ValueError(
                        f"Fastformer reads {TYPE_VOCAB_SIZE} token types, as BERT (a text or a pair), got "
                        f"type_vocab_size={value}"
                    )
                if value != COPY_FIELDS.get(name, value):
                    raise ValueError(
                        f"`{name}` is a field of FastformerCopyConfig (the copy head's model, "
                        f"FastformerCopyForConditionalGeneration), not of FastformerConfig: got {name}={value!r}"
                    )
        moved = {
            "additive_attention_mode": "model.set_additive_attention_mode(...)",
            "classifier_dropout": "hidden_dropout_prob",
            "type_vocab_size": f"always {TYPE_VOCAB_SIZE}",
        }
        logger.warning(
            f"{type(self).__name__} has no field "
            + ", ".join(f"`{name}`" + (f" (now {moved[name]})" if name in moved else "") for name in retired)
            + " any more: dropped, with no change to the model's outputs"
        )

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs) -> "FastformerConfig":
        """As transformers'; a config that turns on a field of `COPY_FIELDS` loads as `FastformerCopyConfig`."""
        if cls is FastformerConfig and any(config_dict.get(name, off) != off for name, off in COPY_FIELDS.items()):
            cls = FastformerCopyConfig
        return super(FastformerConfig, cls).from_dict(config_dict, **kwargs)

    @property
    def convolution_kernel(self) -> int:
        """The decoder's short convolution's kernel: `FastformerCopyConfig.decoder_conv_kernel`, 0 (none) here."""
        return getattr(self, "decoder_conv_kernel", 0)

    def for_encoder_decoder(self) -> "FastformerConfig":
        """This config if `is_encoder_decoder`, else a copy that is: `FastformerForConditionalGeneration`'s, which
        leaves the given one as it was (it may serve an encoder too)."""
        if self.is_encoder_decoder:
            return self
        config = copy.deepcopy(self)
        config.is_encoder_decoder = True
        return config

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs):
        """As transformers'. Where the class is registered for Hub code, `auto_map` also names every head (so that
        any head's checkpoint loads into all of them), and an encoder-decoder's config declares the summarization
        pipeline (`custom_pipelines`) and gets its file. Entries the config already has are kept."""
        if self.is_remote_code():
            self.auto_map = {**self.hub_auto_map(), **(getattr(self, "auto_map", None) or {})}
            if self.is_encoder_decoder:
                # imported here (it imports transformers' pipelines), relatively, so that Hub code ships its file
                from .pipeline_fastformer import SummarizationPipeline

                pipelines = getattr(self, "custom_pipelines", None) or {}
                self.custom_pipelines = {**copy.deepcopy(SUMMARIZATION_PIPELINE), **pipelines}
                os.makedirs(save_directory, exist_ok=True)
                custom_object_save(SummarizationPipeline, save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    @classmethod
    def hub_auto_map(cls) -> dict[str, str]:
        """The Hub code's `auto_map`: this config's class, and the class of every head it serves."""
        return AUTO_MAP

    @property
    def layer_types(self) -> list[str]:
        """Every layer application's cache layer type, as `DynamicCache(config=...)` reads it from the decoder's
        config: "fastformer", the `FastformerCacheLayer` that the modeling file registers."""
        return ["fastformer"] * self.num_hidden_layers

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """As transformers'; the decoder's config has `num_decoder_layers` as its `num_hidden_layers`."""
        config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder and self.num_decoder_layers != config.num_hidden_layers:
            config = copy.deepcopy(config)
            config.num_hidden_layers = self.num_decoder_layers
        return config

    def validate_layer_type(self):
        """Part of `@strict`-powered validation: none (`layer_types` follow `num_hidden_layers`)."""

    @property
    def embedding_width(self) -> int:
        """`embedding_size`, or `hidden_size` where it is None (read at use: a changed `hidden_size` counts)."""
        return self.embedding_size or self.hidden_size

    def validate_architecture(self):
        """Part of `@strict`-powered validation: the fields that must fit together."""
        super().validate_architecture()
        for name in ("num_attention_heads", "cls_attention_heads"):
            if self.hidden_size % (getattr(self, name) or 1):
                raise ValueError(
                    f"`hidden_size` ({self.hidden_size}) must be divisible by `{name}` ({getattr(self, name)})"
                )
        if self.chunk_size_feed_forward < 0:
            raise ValueError(
                f"`chunk_size_feed_forward` must be 0 (no chunks) or more, got {self.chunk_size_feed_forward}"
            )

    def validate_token_ids(self):
        """Part of `@strict`-powered validation: special ids lie in the vocabulary (transformers only warns)."""
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [] if value is None else [value]
            if not all(0 <= token_id < self.vocab_size for token_id in ids):
                allowed = "None, an id or a list of ids" if name == "eos_token_id" else "None or an id"
                raise ValueError(f"`{name}` must be {allowed} in [0, {self.vocab_size}), got {value!r}")
        super().validate_token_ids()


@strict
class FastformerCopyConfig(FastformerConfig):
    r"""Configuration of `FastformerCopyForConditionalGeneration` (Fastformer with See et al.'s pointer-generator,
    2017) and `FastformerCopyForCausalLM`: `FastformerConfig`'s fields, the copy head's and the short convolution's.

    Args:
        copy_spans (`bool`, defaults to False): the copy attention adds a learned gate g_t = u . h_t + c to the score
            of every source position whose previous token is the decoder's input token t (`decoder_input_ids` or
            `labels`): copying continues a span in order (an induction head, which additive attention cannot form).
        copy_context_window (`int`, defaults to 0): an odd window W of at least 3 (0: none): the copy head reads each
            source position as its encoder output plus a learned depthwise convolution (starting at zero) of the W
            outputs centred on it.
        decoder_conv_kernel (`int`, defaults to 0): a kernel K of at least 2 (0: none): every decoder layer's causal
            attention reads each token plus a learned depthwise convolution of it and the K - 1 tokens before it
            (`functional.causal_convolution`, the short convolution of Mamba2's linear attention: a pooled prefix
            holds no order). Padding is skipped; the cache keeps each layer application's last K - 1 tokens.
    """

    model_type = "fastformer_copy"

    copy_spans: bool = False
    copy_context_window: int = 0
    decoder_conv_kernel: int = _convolution_kernel(0)

    @classmethod
    def hub_auto_map(cls) -> dict[str, str]:
        return {**AUTO_MAP, **COPY_AUTO_MAP}

    def validate_architecture(self):
        """Part of `@strict`-powered validation: the fields that must fit together."""
        super().validate_architecture()
        check_copy_context_window(self.copy_context_window)


__all__ = ["FastformerConfig", "FastformerCopyConfig"]
