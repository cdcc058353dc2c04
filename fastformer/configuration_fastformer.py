"""Fastformer configuration."""

from transformers import PreTrainedConfig
from transformers.activations import ACT2FN

from .functional import INTERACTIONS

POOLER_TYPES = ("additive", "cls", "mean")
CROSS_ATTENTION_TYPES = ("softmax", "additive")


def _check_choice(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"`{name}` must be one of {tuple(allowed)}, got {value!r}")


def _check_positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}")


def _check_probability(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ValueError(f"`{name}` must be a number in [0, 1), got {value!r}")


class FastformerConfig(PreTrainedConfig):
    r"""Configuration of a Fastformer encoder (Wu et al., 2021, arXiv:2108.09084).

    The defaults are the paper's final classification model: hidden size 256, 16 heads, 2 layers, dropout
    0.2, element-wise product interaction, query-value and layer-wise parameter sharing, additive-attention
    pooling for classification.

    Args:
        vocab_size (`int`, defaults to 30522): number of token ids (bert-base-uncased WordPiece).
        hidden_size (`int`, defaults to 256): width of the token representations.
        num_hidden_layers (`int`, defaults to 2): number of Fastformer layers applied.
        num_attention_heads (`int`, defaults to 16): heads; must divide `hidden_size`.
        intermediate_size (`int`, defaults to 1024): width of the feed-forward block.
        hidden_act (`str`, defaults to `"gelu"`): feed-forward activation, a key of `transformers.activations.ACT2FN`.
        hidden_dropout_prob (`float`, defaults to 0.2): dropout on embeddings and on each sub-layer's output.
        max_position_embeddings (`int`, defaults to 2048): longest input; positions are learned embeddings.
        layer_norm_eps (`float`, defaults to 1e-12): LayerNorm epsilon.
        initializer_range (`float`, defaults to 0.02): std of the normal init of every weight matrix and of w_q, w_k.
        pad_token_id (`int`, defaults to 0): padding id (its embedding starts at zero).
        classifier_dropout (`float`, *optional*): dropout before the classifier; `hidden_dropout_prob` if None.
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
        pooler_type (`str`, defaults to `"additive"`): how `FastformerModel` pools the last layer into
            `pooler_output` for classification: `"additive"` (the paper's: a tanh MLP gives one logit per token,
            masked softmax, weighted sum), `"cls"` (the first real token) or `"mean"` (mean of real tokens).

    Generation (`FastformerForConditionalGeneration`, `FastformerForCausalLM`):
        num_decoder_layers (`int`, *optional*): decoder layers; `num_hidden_layers` if None. The decoder uses the
            same switches as the encoder (sharing, interaction), with causal (prefix) additive attention.
        cross_attention_type (`str`, defaults to `"softmax"`): how decoder tokens read the encoder output:
            `"softmax"` (multi-head scaled dot-product attention, O(target x source) and a cache of the
            encoder's keys and values) or `"additive"` (one context per head pooled from the encoder values,
            c = sum_j softmax_j(w_c . v_j / sqrt(d)) v_j, then c * q_t for each decoder token: O(source) once,
            O(1) per generated token, and a cache of one vector per head).
        bos_token_id, eos_token_id, decoder_start_token_id (`int`, *optional*): special ids for generation.
        use_cache (`bool`, defaults to True): return the decoder's generation state (`FastformerCache`).
    """

    model_type = "fastformer"

    def __init__(
        self,
        vocab_size=30522,
        hidden_size=256,
        num_hidden_layers=2,
        num_attention_heads=16,
        intermediate_size=1024,
        hidden_act="gelu",
        hidden_dropout_prob=0.2,
        max_position_embeddings=2048,
        layer_norm_eps=1e-12,
        initializer_range=0.02,
        pad_token_id=0,
        classifier_dropout=None,
        tie_word_embeddings=True,
        share_query_value=True,
        share_layers=True,
        share_heads=False,
        interaction="product",
        pooler_type="additive",
        num_decoder_layers=None,
        cross_attention_type="softmax",
        bos_token_id=None,
        eos_token_id=None,
        decoder_start_token_id=None,
        use_cache=True,
        **kwargs,
    ):
        num_decoder_layers = num_hidden_layers if num_decoder_layers is None else num_decoder_layers
        for name, value in [
            ("vocab_size", vocab_size),
            ("hidden_size", hidden_size),
            ("num_hidden_layers", num_hidden_layers),
            ("num_attention_heads", num_attention_heads),
            ("intermediate_size", intermediate_size),
            ("max_position_embeddings", max_position_embeddings),
            ("num_decoder_layers", num_decoder_layers),
        ]:
            _check_positive_int(name, value)
        if hidden_size % num_attention_heads:
            raise ValueError(
                f"`hidden_size` ({hidden_size}) must be divisible by `num_attention_heads` ({num_attention_heads})"
            )
        _check_choice("hidden_act", hidden_act, sorted(ACT2FN))
        _check_probability("hidden_dropout_prob", hidden_dropout_prob)
        if classifier_dropout is not None:
            _check_probability("classifier_dropout", classifier_dropout)
        for name, value in [("layer_norm_eps", layer_norm_eps), ("initializer_range", initializer_range)]:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"`{name}` must be a positive number, got {value!r}")
        for name, value in [
            ("pad_token_id", pad_token_id),
            ("bos_token_id", bos_token_id),
            ("eos_token_id", eos_token_id),
            ("decoder_start_token_id", decoder_start_token_id),
        ]:
            if value is not None and not (isinstance(value, int) and 0 <= value < vocab_size):
                raise ValueError(f"`{name}` must be None or an id in [0, {vocab_size}), got {value!r}")
        for name, value in [
            ("tie_word_embeddings", tie_word_embeddings),
            ("share_query_value", share_query_value),
            ("share_layers", share_layers),
            ("share_heads", share_heads),
            ("use_cache", use_cache),
        ]:
            if not isinstance(value, bool):
                raise ValueError(f"`{name}` must be one of (True, False), got {value!r}")
        _check_choice("interaction", interaction, INTERACTIONS)
        _check_choice("pooler_type", pooler_type, POOLER_TYPES)
        _check_choice("cross_attention_type", cross_attention_type, CROSS_ATTENTION_TYPES)

        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.max_position_embeddings = max_position_embeddings
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        self.pad_token_id = pad_token_id
        self.classifier_dropout = classifier_dropout
        self.tie_word_embeddings = tie_word_embeddings
        self.share_query_value = share_query_value
        self.share_layers = share_layers
        self.share_heads = share_heads
        self.interaction = interaction
        self.pooler_type = pooler_type
        self.num_decoder_layers = num_decoder_layers
        self.cross_attention_type = cross_attention_type
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_id
        self.decoder_start_token_id = decoder_start_token_id
        self.use_cache = use_cache
        super().__init__(**kwargs)


# a saved config carries this file as Hub code (trust_remote_code=True)
FastformerConfig.register_for_auto_class()

__all__ = ["FastformerConfig"]
