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
    """A field factory, used as `name: int = _positive_int(default)`. A value must pass `holds` (None is left to
    the annotation, which allows it or not); `requirement` words the rule for the error message, which `@strict`
    prefixes with the field's name."""

    def check(value):
        if value is not None and not holds(value):
            raise ValueError(f"must be {requirement}, got {value!r}")

    return lambda default: validated_field(check, default=default)


_positive_int = _requires("a positive integer", lambda value: value >= 1)
_positive_number = _requires("a positive number", lambda value: value > 0)
_probability = _requires("a number in [0, 1)", lambda value: 0 <= value < 1)
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
# fields of earlier releases, dropped with a warning where a saved config still has them: the copy head's and the
# decoder's short convolution's (`FastformerCopyConfig`'s now, with the value that leaves them out), the attention's
# mode of computation (`set_additive_attention_mode`), the classifier's dropout (`hidden_dropout_prob`) and the
# number of token types (BERT's two, always), which change no output
COPY_FIELDS = {
    "copy_mechanism": False,
    "copy_spans": False,
    "copy_context_window": 0,
    "decoder_conv_kernel": 0,
}
RETIRED_FIELDS = ("additive_attention_mode", "classifier_dropout", "type_vocab_size", *COPY_FIELDS)


def check_copy_context_window(window: int):
    """Refuses a `copy_context_window` (`FastformerCopyConfig`'s, or a BERT2BERT decoder config's) that is no odd
    window of at least 3 tokens centred on each one (0: none)."""
    if window != 0 and (window < 3 or window % 2 == 0):
        raise ValueError(
            f"`copy_context_window` must be 0 (none) or an odd window of at least 3 tokens centred on each one, got "
            f"{window}"
        )


@strict
class FastformerConfig(PreTrainedConfig):
    r"""Configuration of a Fastformer encoder (Wu et al., 2021, arXiv:2108.09084).

    The defaults are the paper's final classification model: hidden size 256, 16 heads, 2 layers, dropout
    0.2, element-wise product interaction, query-value and layer-wise parameter sharing, additive-attention
    pooling for classification.

    A bad value raises `@strict`'s `StrictDataclassFieldValidationError` (at construction and at assignment), which
    names the field, what it must be and the value given; fields that do not fit together raise its
    `StrictDataclassClassValidationError` (at the end of construction, and by `validate()` and `save_pretrained`),
    which names the validator and the rule broken.

    Saved while the class is registered for Hub code (`register_for_auto_class`), a config names the classes of
    every head in `auto_map`, and an encoder-decoder's declares the summarization pipeline (`save_pretrained`).

    Args:
        vocab_size (`int`, defaults to 30522): number of token ids (bert-base-uncased WordPiece).
        hidden_size (`int`, defaults to 256): width of the token representations.
        embedding_size (`int`, *optional*): width of the word and position embeddings, projected to `hidden_size`
            when it differs (as ELECTRA's and ALBERT's); `hidden_size` if None (`embedding_width` reads it). A
            generative model (whose LM head is the word embedding matrix) needs it equal to `hidden_size`.
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
        share_query_value (`bool`, defaults to True): query-value sharing (RQ3): values use the query
            transformation (W_v = W_q), so the layer has no W_v.
        share_layers (`bool`, defaults to True): layer-wise sharing (RQ3): one layer's parameters applied
            `num_hidden_layers` times.
        share_heads (`bool`, defaults to False): head-wise sharing (RQ3): all heads use one w_q and one w_k (and
            one interaction projection with `interaction="concat"`). These are the only per-head parameters of
            Fastformer, since W_q, W_k, W_v and W_r are full hidden-by-hidden matrices. The paper found it hurts.
        interaction (`str`, defaults to `"product"`): how a global vector meets each token (RQ2): `"product"`
            (p_i = q * k_i, u_i = k * v_i), `"add"` (q + k_i, k + v_i) or `"concat"` ([q; k_i] P with a learned
            projection P of shape (2 * head_dim, head_dim) per head, one for each of the two interactions).
        query_residual (`bool`, defaults to True): the paper's query residual, the attention output r_i + q_i (the
            authors' code); False gives r_i alone, the attention output of a softmax Transformer, which is what
            models converted from BERT use (`fastformer.conversion`): there the residual adds a term the teacher
            does not have.
        chunk_size_feed_forward (`int`, defaults to 0, `PreTrainedConfig`'s field): every feed-forward block runs
            on at most this many tokens at a time (0, transformers' default: all at once): the same result; without
            gradients, a long batch's (tokens x intermediate_size) activations are then never held at once
            (docs/PRETRAINED.md, memory), at the cost of a kernel launch per chunk on a GPU.
        pooler_type (`str`, defaults to `"additive"`): how `FastformerModel` pools the last layer into
            `pooler_output` for classification: `"additive"` (the paper's: a tanh MLP gives one logit per token,
            masked softmax, weighted sum), `"cls"` (the first real token), `"mean"` (mean of real tokens), or
            `"cls_tanh"`, `"cls_relu"`, `"cls_gelu"` (the first real token through a dense layer and that activation:
            BERT's pooler; the heads of classifiers converted by `fastformer.conversion`).

    Generation (`FastformerForConditionalGeneration`, `FastformerForCausalLM`):
        num_decoder_layers (`int`, *optional*): decoder layers; `num_hidden_layers` if None. The decoder uses the
            same switches as the encoder (sharing, interaction), with causal (prefix) additive attention.
        cross_attention_type (`str`, defaults to `"softmax"`): how decoder tokens read the encoder output:
            `"softmax"` (multi-head scaled dot-product attention, O(target x source) and a cache of the
            encoder's keys and values) or `"additive"` (one context per head pooled from the encoder values,
            c = sum_j softmax_j(w_c . v_j / sqrt(d)) v_j, then c * q_t for each decoder token: O(source) once,
            O(1) per generated token, and a cache of one vector per head).
        tie_encoder_embeddings (`bool`, defaults to True): the encoder reads the decoder's word embeddings (one
            matrix for the encoder, the decoder and the LM head); False gives the encoder its own, so that a frozen
            encoder stays fixed while the decoder trains.
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
    num_decoder_layers: int | None = _positive_int(None)
    cross_attention_type: Literal["softmax", "additive"] = "softmax"
    tie_encoder_embeddings: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | list[int] | None = None
    decoder_start_token_id: int | None = None
    use_cache: bool = True

    def __post_init__(self, **kwargs):
        kwargs.pop("model_type", None)  # the class's (a config saved before `FastformerCopyConfig` names "fastformer")
        self.drop_retired_fields(kwargs)
        if self.num_decoder_layers is None:  # as T5: the decoder mirrors the encoder
            self.num_decoder_layers = self.num_hidden_layers
        super().__post_init__(**kwargs)

    def drop_retired_fields(self, kwargs: dict):
        """Takes the fields of earlier releases out of `kwargs`, with a warning: a value that changed outputs then
        (the copy head's and the short convolution's) is refused here, where `FastformerCopyConfig` holds it (a saved
        config holding one loads as that: `from_dict`)."""
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
        """As transformers', and a config saved before the copy head's fields left `FastformerConfig`, holding the
        head or the short convolution, loads as the `FastformerCopyConfig` it is now."""
        if cls is FastformerConfig and any(config_dict.get(name, off) != off for name, off in COPY_FIELDS.items()):
            cls = FastformerCopyConfig
        return super(FastformerConfig, cls).from_dict(config_dict, **kwargs)

    @property
    def convolution_kernel(self) -> int:
        """The decoder's short convolution's kernel: `FastformerCopyConfig.decoder_conv_kernel`, 0 (none) here."""
        return getattr(self, "decoder_conv_kernel", 0)

    def for_encoder_decoder(self) -> "FastformerConfig":
        """This config if `is_encoder_decoder`, else a copy that is (what generate() reads): the config of
        `FastformerForConditionalGeneration`, which leaves the one it is given as it was (it may serve an encoder
        too)."""
        if self.is_encoder_decoder:
            return self
        config = copy.deepcopy(self)
        config.is_encoder_decoder = True
        return config

    def save_pretrained(self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs):
        """As `PreTrainedConfig.save_pretrained`, which, where the class is registered for Hub code
        (`register_for_auto_class`), copies its code beside the config and names it in `auto_map`. There `auto_map`
        also names the class of every head, so that the checkpoint of any head loads into all of them as Hub code
        (`trust_remote_code=True`), and an encoder-decoder's config declares the summarization pipeline
        (`custom_pipelines`), whose file is copied beside it. Entries the config already has are kept."""
        if self.is_remote_code():
            self.auto_map = {**self.hub_auto_map(), **(getattr(self, "auto_map", None) or {})}
            if self.is_encoder_decoder:
                # here, as it imports transformers' pipelines; a relative import all the same, so that transformers
                # ships the pipeline's file with this one as Hub code (with its relative imports): a config loaded
                # as Hub code can save it again
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
        """Every layer application's cache layer type, as `DynamicCache(config=...)` and generate() read it from the
        decoder's config (`get_text_config(decoder=True)`): "fastformer", the `FastformerCacheLayer` that the
        modeling file registers when it is imported (with the package, or a model's Hub code)."""
        return ["fastformer"] * self.num_hidden_layers

    def get_text_config(self, decoder=None, encoder=None) -> PreTrainedConfig:
        """As transformers', and the decoder's config has `num_decoder_layers` as its `num_hidden_layers` (the number
        of layer applications a decoder's cache holds)."""
        config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder and self.num_decoder_layers != config.num_hidden_layers:
            config = copy.deepcopy(config)
            config.num_hidden_layers = self.num_decoder_layers
        return config

    def validate_layer_type(self):
        """Part of `@strict`-powered validation. transformers' own checks that `layer_types` are its types, one per
        layer; Fastformer's are made from `num_hidden_layers` (`layer_types`), of its own type, and cannot differ."""

    @property
    def embedding_width(self) -> int:
        """The width of the word and position embeddings: `embedding_size`, or `hidden_size` where it is None (read
        at use, so that a `hidden_size` changed after init, as by `--config_overrides`, still sizes them)."""
        return self.embedding_size or self.hidden_size

    def validate_architecture(self):
        """Part of `@strict`-powered validation: the fields that must fit together."""
        super().validate_architecture()
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({self.hidden_size}) must be divisible by `num_attention_heads` "
                f"({self.num_attention_heads})"
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
    r"""Configuration of `FastformerCopyForConditionalGeneration`, Fastformer's encoder-decoder with See et al.'s
    pointer-generator (2017), which the headline recipe (scripts/run_summarization.py) trains: `FastformerConfig`'s
    fields, and the switches of its copy head and of its decoder's short convolution.
    A config saved with them before they left `FastformerConfig` loads as this (`FastformerConfig.from_dict`).

    Args:
        copy_spans (`bool`, defaults to False): the copy head can continue a span of the source: its attention adds
            a learned gate g_t = u . h_t + c to the score of every source position whose previous token is the
            decoder's input token t (the token just written), so that copying it writes the source's next token, in
            order (an induction head, which additive attention cannot form). The decoder's input ids are read then
            (`decoder_input_ids` or `labels`).
        copy_context_window (`int`, defaults to 0): an odd window W of at least 3 (0: none): the copy head reads
            every source position as its encoder output plus a learned depthwise convolution of the W outputs
            centred on it (starting at zero), so that where a copy may start or stop is scored from its neighbours.
        decoder_conv_kernel (`int`, defaults to 0): a kernel K of at least 2 (0: none): every decoder layer's causal
            attention reads each token plus a learned depthwise convolution of it and the K - 1 tokens before it
            (`functional.causal_convolution`), the short convolution that Mamba2 and Qwen3-Next run beside their
            linear attention: a pooled prefix holds no order. The cache keeps each layer application's last K - 1
            tokens; padding is skipped wherever it is. `FastformerCopyForCausalLM` is the causal LM with it.
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
