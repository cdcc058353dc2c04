"""Fastformer models for transformers: the encoder (post-LN, as the authors' code), its task heads
and the generative models, whose decoder carries a constant-size state (`FastformerCacheLayer`).
Relative imports only, so that a saved checkpoint carries this file as Hub code."""

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    STATIC_LAYER_TYPE_MAPPING,
    Cache,
    DynamicCache,
    EncoderDecoderCache,
    LinearAttentionLayer,
)
from transformers.conversion_mapping import register_checkpoint_conversion_mapping
from transformers.core_model_loading import WeightRenaming
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.masking_utils import create_bidirectional_mask, find_packed_sequence_indices
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    BaseModelOutputWithPooling,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
    SequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, slice_logits_to_keep
from transformers.models.bart.modeling_bart import eager_attention_forward
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, auto_docstring, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import can_return_tuple, merge_with_config_defaults
from transformers.utils.import_utils import is_torchdynamo_compiling, is_tracing
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .checks import (
    check_inputs,
    check_keywords,
    check_position_ids,
    check_token_type_ids,
    checked_classification_labels,
    checked_token_labels,
)
from .configuration_fastformer import TYPE_VOCAB_SIZE, FastformerConfig
from .functional import (
    CausalAttentionState,
    PackedRows,
    PoolingMask,
    PoolingState,
    accumulation_dtype,
    additive_attention,
    additive_pooling,
    as_pooling_mask,
    causal_additive_attention,
    causal_convolution,
    causal_mask,
    packed_additive_attention,
    packed_rows,
    pool_projections,
    pooling_mask,
    repack,
    unpack,
)

logger = logging.get_logger(__name__)


def compute_dtype(hidden_states: torch.Tensor) -> torch.dtype:
    """The dtype the attention computes in: autocast's where it is on, else the hidden states'."""
    device = hidden_states.device.type
    # "meta" has no autocast
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return hidden_states.dtype


class FastformerTokenTypeEmbeddings(nn.Embedding):
    """BERT's two token type embeddings, zero at the start (no random draw); row 0 stays zero."""

    def __init__(self, config: FastformerConfig):
        size = (TYPE_VOCAB_SIZE, config.embedding_width)
        super().__init__(*size, padding_idx=0, _weight=torch.zeros(size))


def split_heads(heads: int, x: torch.Tensor) -> torch.Tensor:
    """(B, N, H*D) -> (B, H, N, D)"""
    return x.view(*x.shape[:2], heads, -1).transpose(1, 2)


class FastformerEmbeddings(nn.Module):
    """Token + position + token type embeddings (none with `token_types=False`), LayerNorm, dropout,
    projection to `hidden_size` (as ELECTRA's). Without `token_type_ids`, type 0 is looked up where
    gradients flow, so that every backward reaches the table (DDP, FSDP)."""

    def __init__(self, config: FastformerConfig, token_types: bool = True):
        super().__init__()
        size, hidden_size = config.embedding_width, config.hidden_size
        self.word_embeddings = nn.Embedding(config.vocab_size, size, config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, size)
        self.token_type_embeddings = None
        if token_types:
            self.token_type_embeddings = FastformerTokenTypeEmbeddings(config)
            zero = torch.zeros(1, 1, dtype=torch.long)
            self.register_buffer("token_type_zero", zero, persistent=False)
        self.layer_norm = nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(size, hidden_size) if size != hidden_size else None

    def forward(self, input_ids=None, position_ids=None, inputs_embeds=None, token_type_ids=None):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        table = self.token_type_embeddings
        learned = table is not None and table.weight.requires_grad and torch.is_grad_enabled()
        if token_type_ids is None and learned:
            token_type_ids = self.token_type_zero.expand(embeddings.shape[:2])
        if token_type_ids is not None:
            embeddings = embeddings + table(token_type_ids)
        embeddings = self.dropout(self.layer_norm(embeddings))
        return embeddings if self.projection is None else self.projection(embeddings)


class FastformerAttention(nn.Module):
    """Additive attention over all heads (Eqs. 3-6), then r_i = W_r u_i and the query residual
    r_i + q_i (`config.query_residual`)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        hidden_size = config.hidden_size
        if hidden_size % config.num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention "
                f"heads ({config.num_attention_heads})"
            )
        self.num_heads = config.num_attention_heads
        self.head_dim = hidden_size // self.num_heads
        self.interaction = config.interaction
        self.query_residual = config.query_residual
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = None if config.share_query_value else nn.Linear(hidden_size, hidden_size)
        self.transform = nn.Linear(hidden_size, hidden_size)  # W_r
        # w_q and w_k are the only per-head parameters; head-wise sharing keeps one of each
        heads = 1 if config.share_heads else self.num_heads
        self.query_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        self.key_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        if config.interaction == "concat":
            shape = (heads, 2 * self.head_dim, self.head_dim)
            self.query_key_projection = nn.Parameter(torch.empty(shape))
            self.key_value_projection = nn.Parameter(torch.empty(shape))
        else:
            self.query_key_projection = self.key_value_projection = None

    def _per_head(self, parameter):
        if parameter is None or parameter.shape[0] == self.num_heads:
            return parameter
        return parameter.expand(self.num_heads, *parameter.shape[1:])  # head-wise sharing

    def _project(self, hidden_states):
        """The query (kept whole for the residual) and the per-head queries, keys and values."""
        query = self.query(hidden_states)  # (B, N, H*D)
        heads = partial(split_heads, self.num_heads)
        q, k = heads(query), heads(self.key(hidden_states))
        v = q if self.value is None else heads(self.value(hidden_states))  # query-value sharing
        return query, q, k, v

    def _attention_arguments(self):
        """w_q, w_k and the interaction settings, as the functional API takes them."""
        vectors = (self._per_head(self.query_weight), self._per_head(self.key_weight))
        settings = dict(
            interaction=self.interaction,
            query_key_projection=self._per_head(self.query_key_projection),
            key_value_projection=self._per_head(self.key_value_projection),
        )
        return vectors, settings

    def _output(self, u, query):  # u: (B, H, N, D)
        u = u.transpose(1, 2).reshape(query.shape)  # (B, N, H*D)
        return self.transform(u) + query if self.query_residual else self.transform(u)

    def forward(self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False):
        """The output and the pooling weights (B, H, 2, N) or None; `segment_ids`: packed rows."""
        query, q, k, v = self._project(hidden_states)
        vectors, settings = self._attention_arguments()
        options = dict(return_weights=output_attentions, **settings)
        if segment_ids is None:
            u, weights = additive_attention(q, k, v, *vectors, attention_mask, **options)
        else:
            u, weights = packed_additive_attention(q, k, v, *vectors, segment_ids, **options)
        return self._output(u, query), weights


class FastformerShortConvolution(nn.Module):
    """The input plus a learned depthwise causal convolution of it, continuing from a cache; packed
    rows convolve each sequence alone, and padding is skipped."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.hidden_size, 1, config.convolution_kernel))

    def forward(self, hidden_states, token_mask=None, cache_layer=None, packed=None):
        if packed is not None:  # a sequence a row, zeros after its end
            rows = unpack(hidden_states[:, None], packed)
            return repack(causal_convolution(rows[:, 0], self.weight)[0][:, None], packed)[:, 0]
        state = None if cache_layer is None else cache_layer.conv_state()
        out, new_state = causal_convolution(hidden_states, self.weight, token_mask, state)
        if cache_layer is not None:
            cache_layer.update_conv_state(new_state)
        return out


class FastformerCausalAttention(FastformerAttention):
    """The decoder's attention: every position pools its prefix, continuing `cache_layer`'s state.
    Returns the output and the pooling weights (B, H, 2, T, T) or None."""

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.convolution = FastformerShortConvolution(config) if config.convolution_kernel else None

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        cache_layer=None,
        output_attentions=False,
        packed=None,
        token_mask=None,
    ):
        state = None if cache_layer is None else cache_layer.attention_state()
        if output_attentions and state is not None:
            # refused before the convolution moves its state on: the cache stays as it was
            raise ValueError(
                "`output_attentions=True` needs the decoder's whole sequence in one forward pass, "
                "but the cache holds earlier tokens as a pooled state, without their weights: run "
                "without a cache (use_cache=False, as in generate(..., use_cache=False))"
            )
        if self.convolution is not None:
            hidden_states = self.convolution(hidden_states, token_mask, cache_layer, packed)
        query, q, k, v = self._project(hidden_states)
        vectors, settings = self._attention_arguments()
        if packed is not None:  # a sequence a row (S, H, L, D); back to packed rows after
            q, k, v = (unpack(x, packed) for x in (q, k, v))
            attention_mask = packed.mask
        u, state, weights = causal_additive_attention(
            q, k, v, *vectors, attention_mask, state, return_weights=output_attentions, **settings
        )
        if cache_layer is not None:
            cache_layer.update_attention_state(state, hidden_states.shape[1])
        if packed is not None:
            u = repack(u, packed)
        return self._output(u, query), weights


class FastformerCrossAttention(nn.Module):
    """Decoder tokens read the encoder output: "softmax" attention, as BART's, or "additive": token
    t gets c * q_t, c = sum_j softmax_j(w_c . v_j / sqrt(d)) v_j per head. `encode` makes the (key,
    value) pair an `EncoderDecoderCache` keeps: the source's, or c as a one-position pair."""

    is_causal = False  # read by transformers' attention functions

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config  # the attention function is looked up at every call
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.hidden_dropout_prob  # on the attention weights in training, as BART's
        self.cross_attention_type = config.cross_attention_type
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        if self.cross_attention_type == "softmax":
            self.key = nn.Linear(config.hidden_size, config.hidden_size)
        else:
            self.context_weight = nn.Parameter(torch.empty(self.num_heads, self.head_dim))  # w_c

    def encode(self, encoder_hidden_states, encoder_attention_mask=None):
        value = split_heads(self.num_heads, self.value(encoder_hidden_states))  # (B, H, M, D)
        if self.cross_attention_type == "additive":
            mask = encoder_attention_mask
            context, _ = additive_pooling(value, self.context_weight, mask, return_weights=False)
            context = context.unsqueeze(-2)  # (B, H, D) -> (B, H, 1, D)
            return context, context
        return split_heads(self.num_heads, self.key(encoder_hidden_states)), value

    def forward(self, hidden_states, key, value, source_mask=None, **kwargs):
        """The output and the weights (B, H, T, M) where the attention function gives them."""
        query = split_heads(self.num_heads, self.query(hidden_states))  # (B, H, T, D)
        if self.cross_attention_type == "additive":
            if kwargs.get("output_attentions"):
                raise ValueError(
                    'cross_attention_type="additive" pools the source once, before any decoder '
                    "token: it has no cross-attention weights per token to return "
                    "(`output_attentions=True`); the softmax cross-attention has them"
                )
            # value: the pooled context c, (B, H, 1, D)
            out, weights = (value * query).transpose(1, 2), None
        else:
            attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
            options = dict(scaling=self.scaling, dropout=self.dropout if self.training else 0.0)
            out, weights = attention(self, query, key, value, source_mask, **options, **kwargs)
        return out.reshape(hidden_states.shape), weights  # (B, T, H, D) -> (B, T, H*D)


class FastformerSublayerOutput(nn.Module):
    """dense -> dropout -> add the sub-layer's input -> LayerNorm (post-LN)."""

    def __init__(self, config: FastformerConfig, input_size: int):
        super().__init__()
        self.dense = nn.Linear(input_size, config.hidden_size)
        self.dropout = config.hidden_dropout_prob  # functional, as BART's
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states, residual) -> torch.Tensor:
        return self.add_and_norm(self.dense(hidden_states), residual)

    def add_and_norm(self, projected, residual) -> torch.Tensor:
        """The sub-layer after `dense`, for a caller that applied `dense` itself."""
        projected = nn.functional.dropout(projected, p=self.dropout, training=self.training)
        return self.layer_norm(residual + projected)


class FastformerFeedForward(nn.Module):
    """intermediate -> activation -> dense -> add & LayerNorm, in chunks of
    `config.chunk_size_feed_forward` tokens (0: none)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.output = FastformerSublayerOutput(config, config.intermediate_size)

    def forward(self, hidden_states) -> torch.Tensor:
        chunk = self.config.chunk_size_feed_forward
        tokens = hidden_states.shape[0] * hidden_states.shape[1]
        # traced (compile, export): no chunks, whose comparison would pin a symbolic length
        traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        if chunk and not traced and tokens > chunk:
            flat = hidden_states.reshape(tokens, hidden_states.shape[-1])
            parts = [self.chunk_forward(part) for part in flat.split(chunk)]
            return torch.cat(parts).view_as(hidden_states)
        return self.chunk_forward(hidden_states)

    def chunk_forward(self, hidden_states) -> torch.Tensor:
        return self.output(self.activation(self.intermediate(hidden_states)), hidden_states)


# how `FastformerLayer` computes its attention sub-layer (`set_additive_attention_mode`)
ADDITIVE_ATTENTION_MODES = ("auto", "plain", "collapsed")


class FastformerLayer(GradientCheckpointingLayer):
    """Additive attention -> dense -> add & LayerNorm -> feed-forward -> add & LayerNorm.

    `attention_mode` (`set_additive_attention_mode`) computes the attention sub-layer as the paper
    ("plain"), with the Linear layers folded into one matrix per sequence ("collapsed"), or
    collapsed where it applies and repays ("auto", the default): the same up to rounding."""

    # "auto" folds only batches of this many tokens per hidden unit: below, kernel launches dominate
    collapse_min_tokens_per_unit = 16

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config
        self.attention_mode = "auto"  # one of ADDITIVE_ATTENTION_MODES
        self.attention = FastformerAttention(config)
        self.attention_output = FastformerSublayerOutput(config, config.hidden_size)
        self.feed_forward = FastformerFeedForward(config)

    def folds_plain_linears(self) -> bool:
        """Whether the maps "collapsed" folds are plain `nn.Linear`s with their weights at hand, not
        wrapped (PEFT, quantization) nor offloaded (on "meta" outside their forward)."""
        attention, dense = self.attention, self.attention_output.dense
        maps = (attention.query, attention.key, attention.value, attention.transform, dense)
        plain = all(type(linear) is nn.Linear for linear in maps if linear is not None)
        parameters = (p for module in (attention, dense) for p in module.parameters())
        return plain and not any(p.is_meta for p in parameters)

    def uses_collapsed_attention(self, hidden_states) -> bool:
        """Whether this call folds: in "auto" where the (C x C) matrix (2 C^3 multiply-adds) repays,
        saving 6 N C^2 from N = C / 2 tokens (C with gradients); exported, wherever it applies."""
        mode = self.attention_mode
        if mode == "auto":
            if self.config.interaction != "product":
                return False
            if torch.compiler.is_exporting():
                return self.folds_plain_linears()
            batch, length, hidden_size = hidden_states.shape
            min_length = hidden_size if torch.is_grad_enabled() else hidden_size / 2
            return (
                length >= min_length
                and batch * length >= self.collapse_min_tokens_per_unit * hidden_size
                and self.folds_plain_linears()
            )
        if mode == "plain":
            return False
        if mode != "collapsed":
            raise ValueError(
                f"attention_mode must be one of {ADDITIVE_ATTENTION_MODES}, got {mode!r}; "
                "set it with the model's set_additive_attention_mode"
            )
        if self.config.interaction != "product":
            raise ValueError(
                'attention_mode="collapsed" folds the "product" interaction\'s linear maps and '
                f'needs interaction="product", got interaction={self.config.interaction!r}; '
                'use "auto" or "plain"'
            )
        if not self.folds_plain_linears():
            raise ValueError(
                'attention_mode="collapsed" folds the attention\'s nn.Linear weights, but some '
                "are wrapped (e.g. by a PEFT adapter or by quantization), whose output the folding "
                'would skip, or offloaded by a device map (on "meta" outside their forward); use '
                'set_additive_attention_mode("auto") or "plain"'
            )
        return True

    def forward(self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False, cls=False):
        """The new hidden states and the pooling distributions, as `FastformerAttention`'s."""
        arguments = (attention_mask, segment_ids, output_attentions, cls)
        hidden_states, weights = self.attention_sublayer(hidden_states, *arguments)
        return self.feed_forward(hidden_states), weights

    def cls_attention(self, hidden_states, attended, attention_mask=None):
        """`attended` (the attention sub-layer's output) with the first real token's row replaced by softmax
        attention from it to every real token, in `config.cls_attention_heads` heads through this layer's query,
        key, value and output: the [CLS] row of a BERT layer. One query: linear in the length."""
        attention, heads = self.attention, self.config.cls_attention_heads
        batch, _, width = hidden_states.shape
        mask = as_pooling_mask(attention_mask, compute_dtype(hidden_states))
        first = hidden_states.new_zeros(batch, dtype=torch.long) if mask is None else mask.tokens.int().argmax(-1)
        index = first.view(batch, 1, 1).expand(batch, 1, width)  # left padding puts the first token later
        cls = hidden_states.gather(1, index)  # (B, 1, C)
        value = attention.query if attention.value is None else attention.value
        keys, values = (split_heads(heads, linear(hidden_states)) for linear in (attention.key, value))
        out = nn.functional.scaled_dot_product_attention(
            split_heads(heads, attention.query(cls)), keys, values, attn_mask=None if mask is None else mask.bias
        )
        row = self.attention_output(out.transpose(1, 2).reshape(batch, 1, width), cls)
        return attended.scatter(1, index, row.to(attended.dtype))

    def attention_sublayer(
        self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False, cls=False
    ):
        """attention -> dense -> dropout -> add & LayerNorm (a BERT layer's `attention` module) and
        the weights; `cls`: the first real token's row by `cls_attention`. Packed rows take the plain path."""
        states, mask = hidden_states, attention_mask
        if segment_ids is None and self.uses_collapsed_attention(states):
            projected, weights = self.collapsed_attention(states, mask, output_attentions)
        else:
            attention, weights = self.attention(states, mask, segment_ids, output_attentions)
            projected = self.attention_output.dense(attention)
        attended = self.attention_output.add_and_norm(projected, states)
        return self.cls_attention(states, attended, mask) if cls else attended, weights

    def collapsed_attention(self, hidden_states, attention_mask=None, output_attentions=False):
        """`attention_output.dense(attention(...))` for the "product" interaction, Linear layers
        folded: given the global key k (`pool_projections`), the rest is linear in x_i (the W_q
        terms only with the query residual):
            dense(r_i + q_i) = W_o (W_r (k * (W_v x_i + b_v)) + b_r + W_q x_i + b_q) + b_o
                             = M x_i + m,  M = W_o W_r diag(k) W_v + W_o W_q,
                                           m = W_o (W_r (k * b_v) + b_r + b_q) + b_o
        one (N x C) by (C x C) product per sequence instead of five."""
        attention, dense = self.attention, self.attention_output.dense
        batch, _, hidden_size = hidden_states.shape
        query, key, transform = attention.query, attention.key, attention.transform
        value = query if attention.value is None else attention.value
        (query_weight, key_weight), _ = attention._attention_arguments()
        options = dict(attention_mask=attention_mask, return_weights=output_attentions)
        pooled = partial(pool_projections, hidden_states, **options)
        global_query, alpha = pooled(query.weight, query.bias, query_weight)
        key_weight = key_weight * global_query  # w_k . (q * k_i) = (w_k * q) . k_i
        pooled_key, beta = pooled(key.weight, key.bias, key_weight)
        # sum_i beta_i (q * k_i)
        global_key = (global_query * pooled_key).reshape(batch, 1, hidden_size)
        out_transform = dense.weight @ transform.weight  # W_o W_r
        matrix = (out_transform * global_key) @ value.weight  # (B, C, C)
        inner_bias = (global_key * value.bias) @ transform.weight.T + transform.bias
        if attention.query_residual:
            matrix = matrix + dense.weight @ query.weight
            inner_bias = inner_bias + query.bias
        bias = inner_bias @ dense.weight.T + dense.bias  # (B, 1, C)
        out = torch.baddbmm(bias, hidden_states, matrix.transpose(1, 2))
        return out, torch.stack((alpha, beta), dim=-2) if output_attentions else None


class FastformerDecoderLayer(GradientCheckpointingLayer):
    """Causal attention, cross-attention (in an encoder-decoder), feed-forward. `cross_key` and
    `cross_value` are positional, so that reentrant checkpointing sends their gradients back."""

    def __init__(self, config: FastformerConfig, cross_attention: bool):
        super().__init__()
        self.attention = FastformerCausalAttention(config)
        self.attention_output = FastformerSublayerOutput(config, config.hidden_size)
        if cross_attention:
            self.cross_attention = FastformerCrossAttention(config)
            self.cross_attention_output = FastformerSublayerOutput(config, config.hidden_size)
        else:
            self.cross_attention = self.cross_attention_output = None
        self.feed_forward = FastformerFeedForward(config)

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        cross_key=None,
        cross_value=None,
        source_mask=None,
        cache_layer=None,
        output_attentions=False,
        packed: PackedRows | None = None,
        token_mask=None,
    ):
        arguments = (cache_layer, output_attentions, packed, token_mask)
        attention, _ = self.attention(hidden_states, attention_mask, *arguments)
        hidden_states = self.attention_output(attention, hidden_states)
        if self.cross_attention is not None:
            inputs = (hidden_states, cross_key, cross_value, source_mask)
            cross, _ = self.cross_attention(*inputs, output_attentions=output_attentions)
            hidden_states = self.cross_attention_output(cross, hidden_states)
        return self.feed_forward(hidden_states)


class FastformerScoreVector(nn.Module):
    """The additive pooler's score vector s (no bias: a softmax ignores a shift); not an nn.Linear,
    which quantization would swap, and read in its own forward, as offloading needs."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden_size))
        # drawn as nn.Linear(hidden_size, 1) draws its weight: a seeded model draws the same numbers
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, keys) -> torch.Tensor:
        """The query of each row of `keys` (B, 1, N, C): (B, 1, 1, C)."""
        # a copy at an aligned address: the CPU kernel's summation order follows the query's
        # alignment, which a loaded (memory-mapped) weight lacks, so a reloaded model would differ
        return self.weight.clone().view(1, 1, 1, -1).expand(keys.shape[0], 1, 1, -1)


class FastformerPooler(nn.Module):
    """Pools the last layer into a vector per sequence (`config.pooler_type`), ignoring padding."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.pooler_type = config.pooler_type
        if self.pooler_type == "additive":
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.score = FastformerScoreVector(config.hidden_size)
        if self.pooler_type.startswith("cls_"):
            # BERT's pooler (tanh), DistilBERT's pre-classifier (relu), ELECTRA's head (gelu)
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.activation = ACT2FN[self.pooler_type.removeprefix("cls_")]

    def forward(self, hidden_states, attention_mask=None, mask: PoolingMask | None = None):
        """`mask`: the `PoolingMask` of attention_mask, where the caller has one."""
        if self.pooler_type == "additive":
            # sum_i softmax_i(s . tanh(dense(h_i))) h_i: attention with s as the query, one kernel
            if mask is None:
                mask = as_pooling_mask(attention_mask, compute_dtype(hidden_states))
            keys = torch.tanh(self.dense(hidden_states)).unsqueeze(1)  # (B, 1, N, C)
            query = self.score(keys)  # (B, 1, 1, C)
            bias = None if mask is None else mask.bias
            pooled = nn.functional.scaled_dot_product_attention(
                query, keys, hidden_states.unsqueeze(1), attn_mask=bias, scale=1.0
            ).view(keys.shape[0], -1)
            return pooled if mask is None else pooled * mask.has_tokens.view(-1, 1)
        if attention_mask is None:
            attention_mask = hidden_states.new_ones(hidden_states.shape[:2], dtype=torch.bool)
        attention_mask = attention_mask.to(torch.bool)
        if self.pooler_type.startswith("cls"):
            # left padding puts the first token later
            first_token = attention_mask.int().argmax(dim=-1)
            rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
            pooled = hidden_states[rows, first_token]
            return self.activation(self.dense(pooled)) if self.pooler_type != "cls" else pooled
        weights = attention_mask / attention_mask.sum(dim=-1, keepdim=True).clamp(min=1)  # "mean"
        return (weights.to(hidden_states.dtype).unsqueeze(1) @ hidden_states).squeeze(1)  # (B, C)


@auto_docstring
class FastformerPreTrainedModel(PreTrainedModel):
    config: FastformerConfig
    base_model_prefix = "fastformer"
    _input_embed_layer = "word_embeddings"  # where get/set_input_embeddings find them
    supports_gradient_checkpointing = True
    _supports_sdpa = True  # the softmax cross-attention's; flash and flex are untested here
    # only classes this model has (accelerate's FSDP refuses others); no embeddings (FSDP2 shards)
    _no_split_modules = ["FastformerLayer"]
    _can_compile_fullgraph = True
    # every layer application's output, and the encoder layers' pooling distributions (B, H, 2, N)
    _can_record_outputs = {"hidden_states": FastformerLayer, "attentions": OutputRecorder(FastformerLayer, index=1)}

    def _init_weights(self, module):
        if isinstance(module, FastformerTokenTypeEmbeddings):
            init.zeros_(module.weight)
            return
        if isinstance(module, FastformerEmbeddings) and module.token_type_embeddings is not None:
            init.zeros_(module.token_type_zero)
        super()._init_weights(module)
        normal = partial(init.normal_, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, FastformerCrossAttention):
            if module.cross_attention_type == "additive":
                normal(module.context_weight)
        if isinstance(module, (FastformerShortConvolution, FastformerScoreVector)):
            normal(module.weight)
        if isinstance(module, FastformerAttention):
            vectors = (module.query_weight, module.key_weight)
            for parameter in vectors + (module.query_key_projection, module.key_value_projection):
                if parameter is not None:
                    normal(parameter)

    def set_additive_attention_mode(self, mode: str) -> None:
        """Sets how the encoder layers compute their attention (`FastformerLayer`), as
        `set_attn_implementation` does: "plain", "collapsed" or "auto". Not saved with the model."""
        if mode not in ADDITIVE_ATTENTION_MODES:
            raise ValueError(
                f"set_additive_attention_mode: `mode` must be one of {ADDITIVE_ATTENTION_MODES} "
                f"(how the encoder layers compute their additive attention), got {mode!r}"
            )
        if mode == "collapsed" and self.config.interaction != "product":
            raise ValueError(
                'set_additive_attention_mode: `mode="collapsed"` folds the product interaction\'s '
                'linear maps and needs `interaction="product"`, got '
                f'interaction={self.config.interaction!r}; use "auto" or "plain"'
            )
        for module in self.modules():
            if isinstance(module, FastformerLayer):
                module.attention_mode = mode


class FastformerStack(FastformerPreTrainedModel):
    """Embeddings, then `num_layers` applications of `layers` (one with `config.share_layers`).
    Positions count the real tokens of the attention mask, so that left padding does not shift them;
    a mask over the new columns alone continues after the cached ones (as GPT-2's)."""

    input_name = "input_ids"  # for error messages

    def _layers(self, layer_class, num_layers: int, *args) -> nn.ModuleList:
        self.num_layers = num_layers
        distinct = 1 if self.config.share_layers else num_layers
        return nn.ModuleList(layer_class(self.config, *args) for _ in range(distinct))

    def applied_layers(self):
        """(application index, layer) for every layer application, in order."""
        return ((index, self.layers[index % len(self.layers)]) for index in range(self.num_layers))

    @staticmethod
    def packed_sequences(position_ids, attention_mask, batch_size) -> torch.Tensor | None:
        """The sequence of every token (B, N) where `position_ids` restart without an attention
        mask (packed rows), else None. Not while a graph is traced (reading values breaks it)."""
        if position_ids is None or attention_mask is not None or is_tracing(position_ids):
            return None
        return find_packed_sequence_indices(position_ids.expand(batch_size, -1))

    def embed(self, input_ids, attention_mask, position_ids, inputs_embeds, past_tokens=0, token_type_ids=None):
        """The checked inputs' embeddings (B, N, hidden_size) and boolean attention mask, which may
        also cover the `past_tokens` columns before these (in generation)."""
        batch_size, length = check_inputs(input_ids, inputs_embeds, self.config, self.input_name)
        if token_type_ids is not None:
            if self.embeddings.token_type_embeddings is None:
                raise ValueError(
                    "The encoder-decoder's decoder has no token types (as BART's), but was given "
                    "`token_type_ids`: they are the encoder's "
                    "(`FastformerForConditionalGeneration`'s `token_type_ids`)"
                )
            check_token_type_ids(token_type_ids, (batch_size, length), TYPE_VOCAB_SIZE)
        whole_mask = None
        width = None if attention_mask is None else attention_mask.shape[-1]
        if past_tokens and width == past_tokens + length:
            whole_mask, attention_mask = attention_mask.bool(), attention_mask[:, past_tokens:]
        if attention_mask is not None and tuple(attention_mask.shape) != (batch_size, length):
            also = " (it may also cover the cached tokens)" if past_tokens else ""
            raise ValueError(
                f"`attention_mask` must have shape (batch, seq_len) = {(batch_size, length)}, got "
                f"{tuple(attention_mask.shape)}{also}"
            )
        if attention_mask is not None:
            attention_mask = attention_mask.bool()
        max_positions = self.config.max_position_embeddings
        if position_ids is not None:
            check_position_ids(position_ids, (batch_size, length), max_positions)
        elif past_tokens + length > max_positions:
            given = "input_ids" if inputs_embeds is None else "inputs_embeds"
            raise ValueError(
                f"The `{self.input_name.replace('input_ids', given)}` sequence reaches more than "
                f"{max_positions} positions (`max_position_embeddings`): truncate it, generate "
                "fewer tokens or use a config with more positions"
            )
        elif whole_mask is not None:  # a bool mask's cumsum counts in int64
            position_ids = (whole_mask.cumsum(dim=-1) - 1).clamp(min=0)[:, past_tokens:]
        elif attention_mask is None:
            device = (input_ids if input_ids is not None else inputs_embeds).device
            positions = torch.arange(past_tokens, past_tokens + length, device=device)
            position_ids = positions.expand(batch_size, -1)
        else:
            position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
            position_ids = position_ids + past_tokens if past_tokens else position_ids
        embeddings = self.embeddings(input_ids, position_ids, inputs_embeds, token_type_ids)
        return embeddings, attention_mask


@auto_docstring(
    custom_intro="""
    The bare Fastformer encoder. Its `attentions` are per layer the two pooling distributions
    (batch, num_heads, 2, seq_len), alpha and beta. Positions count real tokens only. Packed rows
    (`DataCollatorWithFlattening`) give every sequence its own hidden states, and no pooler output.
    """
)
class FastformerModel(FastformerStack):
    def __init__(self, config: FastformerConfig, add_pooling_layer: bool = True):
        r"""
        add_pooling_layer (`bool`, *optional*, defaults to `True`):
            Whether to add the pooler (`config.pooler_type`) that gives `pooler_output`.
        """
        super().__init__(config)
        self.embeddings = FastformerEmbeddings(config)
        self.layers = self._layers(FastformerLayer, config.num_hidden_layers)
        self.pooler = FastformerPooler(config) if add_pooling_layer else None
        self.post_init()

    @property
    def cls_layer(self) -> int | None:  # the layer application whose first token attends by softmax, or None
        return self.num_layers - 1 if self.config.cls_attention_heads else None

    @capture_outputs
    @auto_docstring
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        check_keywords(kwargs, type(self).__name__, causal=False)
        hidden_states, attention_mask = self.embed(
            input_ids, attention_mask, position_ids, inputs_embeds, token_type_ids=token_type_ids
        )
        segment_ids = self.packed_sequences(position_ids, attention_mask, hidden_states.shape[0])
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        mask = None  # the mask as the poolings take it, made once for every layer
        if attention_mask is not None:
            mask = pooling_mask(attention_mask, compute_dtype(hidden_states))
        if segment_ids is not None and self.config.cls_attention_heads:  # the first token would attend to all
            raise ValueError(
                "`cls_attention_heads` needs a row per sequence, but the rows are packed: pad them instead"
            )
        for index, layer in self.applied_layers():
            hidden_states, _ = layer(hidden_states, mask, segment_ids, output_attentions, index == self.cls_layer)
        pooled = None
        if self.pooler is not None and segment_ids is None:
            pooled = self.pooler(hidden_states, attention_mask, mask)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=pooled)


@auto_docstring(custom_intro="Fastformer with a linear classifier on its pooled output.")
class FastformerForSequenceClassification(FastformerPreTrainedModel):
    # the loss is a batch mean; from `**kwargs` the Trainer would infer a sum (wrong under DDP)
    accepts_loss_kwargs = False

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.fastformer = FastformerModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> SequenceClassifierOutput:
        args = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs = self.fastformer(*args, return_dict=True, **kwargs)
        if outputs.pooler_output is None:
            raise ValueError(
                f"{type(self).__name__} gives one prediction per row, but the rows are packed "
                "(`position_ids` restart without an attention mask): pad the sequences to a batch "
                "instead of DataCollatorWithFlattening"
            )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None
        if labels is not None:
            labels = checked_classification_labels(labels, self.config, logits.shape[0])
            loss = self.loss_function(labels, logits, self.config)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class FastformerLMHead(nn.Module):
    """dense to `embedding_width`, activation, LayerNorm, output projection (tied by default)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_width)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.embedding_width, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_width, config.vocab_size)

    def forward(self, hidden_states) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.activation(self.dense(hidden_states))))


@auto_docstring(custom_intro="Fastformer with a masked-language-modeling head, for pretraining.")
class FastformerForMaskedLM(FastformerPreTrainedModel):
    _tied_weights_keys = {"lm_head.decoder.weight": "fastformer.embeddings.word_embeddings.weight"}
    accepts_loss_kwargs = True  # `num_items_in_batch` keeps the loss exact under accumulation

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.fastformer = FastformerModel(config, add_pooling_layer=False)
        self.lm_head = FastformerLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    @auto_docstring
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        r"""
        num_items_in_batch (`int` or `torch.Tensor`, *optional*):
            The labelled tokens of a whole gradient accumulation step, which the loss is divided by.
        """
        args = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs = self.fastformer(*args, return_dict=True, **kwargs)
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            labels = checked_token_labels(labels, self.config, shape=logits.shape[:2])
            options = dict(vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch)
            loss = self.loss_function(logits, labels, **options)
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class FastformerCacheLayer(LinearAttentionLayer):
    """The cache of one decoder layer application: the causal attention's state in four recurrent
    slots, the short convolution's last inputs and the columns read, or the source's keys and
    values. States are copied into the held tensors (static addresses, for CUDA graphs) unless they
    have gradients (a later write would change the backward) or replace an inference tensor."""

    _layer_type = "fastformer"
    is_croppable = False
    holds_beams = False  # reordered by beam search: the rows are the last step's beams

    def __init__(self, **kwargs):
        super().__init__(number_of_states=4)
        self.tokens = 0
        self.keys = self.values = None
        self.is_initialized = False

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Keeps the source's keys and values (a cross-attention cache)."""
        self.keys, self.values, self.is_initialized = key_states, value_states, True
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.keys.shape[-2] if self.is_initialized else self.tokens

    def attention_state(self) -> CausalAttentionState | None:
        """The causal attention's state, None before the first token."""
        if not self.has_previous_state[0]:
            return None
        states = self.recurrent_states
        query = PoolingState(states[0], states[1])
        return CausalAttentionState(query, PoolingState(states[2], states[3]))

    def conv_state(self) -> torch.Tensor | None:
        """The short convolution's last inputs (B, D, K - 1), None before the first token."""
        initialized = self.has_previous_state[0] and self.is_conv_states_initialized[0]
        return self.conv_states[0] if initialized else None

    def update_attention_state(self, state: CausalAttentionState, tokens: int):
        """Keeps the state after `tokens` more columns, in place where it can be."""
        new = [tensor for pooling in state for tensor in pooling]
        held = [self.recurrent_states[index] for index in range(len(new))]
        # the four come from one computation: the first speaks for the rest, but for the shape
        same_shape = held[1] is not None and held[1].shape == new[1].shape
        if self._in_place(held[0], new[0]) and same_shape:
            if torch.compiler.is_exporting():  # ONNX has no multi-tensor copy
                for old, tensor in zip(held, new):
                    old.copy_(tensor)
            else:
                torch._foreach_copy_(held, new)
        else:
            for index, tensor in enumerate(new):
                self.recurrent_states[index] = self._own(tensor)
        for index in range(len(new)):
            self.is_recurrent_states_initialized[index] = self.has_previous_state[index] = True
        self.tokens += tokens

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs):
        """Keeps the short convolution's last inputs (`functional.causal_convolution`'s state)."""
        held = self.conv_states[state_idx]
        if self._in_place(held, conv_states):
            held.copy_(conv_states)
        else:
            self.conv_states[state_idx] = self._own(conv_states)
        self.conv_kernel_size[state_idx] = conv_states.shape[-1]
        self.is_conv_states_initialized[state_idx] = True
        return self.conv_states[state_idx]

    def _in_place(self, held: torch.Tensor | None, new: torch.Tensor) -> bool:
        """Whether `new` can be copied into `held`."""
        if held is None or held.shape != new.shape or held.dtype != new.dtype:
            return False
        return held.device == new.device and not new.requires_grad and self._writable(held)

    def _own(self, new: torch.Tensor) -> torch.Tensor:
        """`new` at a static address of its own (a slice would keep what it was cut from)."""
        self.device, self.dtype = new.device, new.dtype
        new = new.contiguous()
        if not is_torchdynamo_compiling():
            torch._dynamo.mark_static_address(new)
        return new

    @staticmethod
    def _writable(held: torch.Tensor) -> bool:
        """Whether `held` is writable: not an inference tensor outside inference mode."""
        inference = is_torchdynamo_compiling() or torch.is_inference_mode_enabled()
        return inference or not held.is_inference()

    def reset(self) -> None:
        """Zeroes the states (in place where writable) and drops the keys and values."""
        for states in (self.recurrent_states, self.conv_states):
            for index, held in states.items():
                if held is not None:
                    states[index] = held.zero_() if self._writable(held) else torch.zeros_like(held)
        self.has_previous_state = dict.fromkeys(self.has_previous_state, False)
        self.tokens, self.holds_beams = 0, False
        self.keys = self.values = None
        self.is_initialized = False

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("A Fastformer cache holds a pooled state, which cannot be rolled back (cropped)")

    def _map_rows(self, rows):
        if self.is_initialized:  # the cross-attention's keys and values
            self.keys, self.values = rows(self.keys), rows(self.values)
        for states, initialized in (
            (self.recurrent_states, self.is_recurrent_states_initialized),
            (self.conv_states, self.is_conv_states_initialized),
        ):
            for index, held in initialized.items():
                if held:
                    states[index] = rows(states[index])

    def reorder_cache(self, beam_idx: torch.LongTensor):
        self._map_rows(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))
        self.holds_beams = True

    def batch_select_indices(self, indices: torch.Tensor):
        self._map_rows(lambda tensor: tensor[indices])

    def batch_repeat_interleave(self, repeats: int):
        self._map_rows(lambda tensor: tensor.repeat_interleave(repeats, dim=0))


# transformers registers only attention cache layers by `_layer_type`; linear-attention ones here
DYNAMIC_LAYER_TYPE_MAPPING[FastformerCacheLayer._layer_type] = FastformerCacheLayer
STATIC_LAYER_TYPE_MAPPING[FastformerCacheLayer._layer_type] = FastformerCacheLayer


class FastformerDecoder(FastformerStack):
    """Embeddings, then `config.num_decoder_layers` causal layers, with cross-attention when
    `cross_attention` (then the cache is an `EncoderDecoderCache`, as BART's)."""

    # attentions: the causal pooling weights (B, H, 2, T, T); cross_attentions (B, H, T, M)
    _can_record_outputs = {
        "hidden_states": FastformerDecoderLayer,
        "attentions": OutputRecorder(FastformerCausalAttention, index=1),
        "cross_attentions": OutputRecorder(FastformerCrossAttention, index=1),
    }
    _no_split_modules = ["FastformerDecoderLayer"]

    def __init__(self, config: FastformerConfig, cross_attention: bool):
        super().__init__(config)
        self.input_name = "decoder_input_ids" if cross_attention else "input_ids"
        self.embeddings = FastformerEmbeddings(config, token_types=not cross_attention)
        num_layers = config.num_decoder_layers
        self.layers = self._layers(FastformerDecoderLayer, num_layers, cross_attention)
        self.post_init()

    def cross_attention_inputs(self, encoder_hidden_states, encoder_attention_mask, cache):
        """Per distinct layer, the (key, value) its cross-attention reads, cached after a step."""
        if self.layers[0].cross_attention is None:
            return [(None, None)] * len(self.layers)
        encoder_decoder = isinstance(cache, EncoderDecoderCache)
        cross_cache = cache.cross_attention_cache if encoder_decoder else None
        inputs = []
        for index, layer in enumerate(self.layers):
            if cross_cache is not None and cache.is_updated.get(index):
                inputs.append((cross_cache.layers[index].keys, cross_cache.layers[index].values))
                continue
            if encoder_hidden_states is None:
                raise ValueError("The decoder's cross-attention needs `encoder_hidden_states` on the first step")
            key, value = layer.cross_attention.encode(encoder_hidden_states, encoder_attention_mask)
            if cross_cache is not None:
                key, value = cross_cache.update(key, value, index)
                cache.is_updated[index] = True
            inputs.append((key, value))
        return inputs

    def source_mask(self, hidden_states, encoder_hidden_states, encoder_attention_mask):
        """The softmax cross-attention's mask over the source, for the attention function in use."""
        cross = self.layers[0].cross_attention
        softmax = cross is not None and self.config.cross_attention_type == "softmax"
        if not softmax or encoder_attention_mask is None:
            return None
        mask = encoder_attention_mask.to(torch.bool)
        # a source that is all padding attends to all of it (no softmax over nothing)
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        if encoder_hidden_states is None:  # a later decoding step: only the source's shape is read
            encoder_hidden_states = hidden_states.new_empty(*mask.shape, 0)
        # no skip of a mask without padding: telling would read its values, a GPU synchronization
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=False,
        )

    def packed(self, position_ids, attention_mask, batch_size, states, kwargs) -> PackedRows | None:
        """The `PackedRows` of packed rows, without a cache only; cross-attention and attention
        weights (which would follow a row, not its sequences) are refused."""
        if states is not None:
            return None
        segment_ids = self.packed_sequences(position_ids, attention_mask, batch_size)
        if segment_ids is None:
            return None
        cross = self.layers[0].cross_attention is not None
        attentions = kwargs.get("output_attentions", self.config.output_attentions)
        refused = {"cross-attention": cross, "output_attentions": attentions}
        if any(refused.values()):
            names = ", ".join(name for name, given in refused.items() if given)
            raise ValueError(
                "The rows are packed (`position_ids` restart without an attention mask), which the "
                f"decoder takes apart without {names}"
            )
        return packed_rows(segment_ids)

    def checked_cache(self, cache: Cache | None, use_cache: bool | None, batch_size: int | None):
        """The cache given (an empty one gets `FastformerCacheLayer`s; one of `batch_size / k` rows
        is repeated k times), else with `use_cache` a new one."""
        if self.training and torch.is_grad_enabled() and self.is_activation_checkpointing:
            if cache is not None and cache.get_seq_length() > 0:
                raise ValueError(
                    "The decoder continues from a cache, which gradient checkpointing cannot "
                    "recompute from: call model.gradient_checkpointing_disable(), or train on the "
                    "whole sequence without a cache"
                )
            if use_cache or cache is not None:
                logger.warning_once(
                    "`use_cache=True` is incompatible with gradient checkpointing. Setting `use_cache=False`."
                )
            return None
        cross = self.layers[0].cross_attention is not None
        if cache is None:
            if not use_cache:
                return None
            cache = DynamicCache(config=self.config)
            return EncoderDecoderCache(cache, DynamicCache(config=self.config)) if cross else cache
        if cross and not isinstance(cache, EncoderDecoderCache):
            raise ValueError(
                "The encoder-decoder continues from an EncoderDecoderCache (as BART), got "
                f"{type(cache).__name__}: pass EncoderDecoderCache(DynamicCache(config=config), "
                "DynamicCache(config=config)), or the cache a forward or generate() returned"
            )
        states = cache.self_attention_cache if cross else cache
        layers = getattr(states, "layers", None)
        if layers is not None and not all(isinstance(x, FastformerCacheLayer) for x in layers):
            if states.get_seq_length() > 0:
                raise ValueError(
                    f"The cache holds keys and values ({type(states).__name__}), as PEFT's prefix "
                    "tuning passes them, but Fastformer's decoder continues from a recurrent "
                    "state: prefix tuning is not supported (prompt tuning and LoRA are)"
                )
            layers.clear()
        if layers is not None and not layers:
            layers.extend(FastformerCacheLayer() for _ in range(self.num_layers))
        first = states.layers[0]
        rows = first.recurrent_states[1].shape[0] if first.has_previous_state[0] else None
        if rows is not None and batch_size is not None and rows != batch_size:
            if batch_size % rows:
                raise ValueError(f"The cache holds {rows} rows, which a batch of {batch_size} cannot continue")
            cache.batch_repeat_interleave(batch_size // rows)
        return cache

    @capture_outputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        token_type_ids=None,
        position_ids=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        check_keywords(kwargs, type(self).__name__, causal=True)
        inputs = input_ids if input_ids is not None else inputs_embeds  # neither: `embed` says so
        cache = self.checked_cache(cache, use_cache, None if inputs is None else inputs.shape[0])
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        past_tokens = 0 if states is None else states.get_seq_length()
        hidden_states, attention_mask = self.embed(
            input_ids, attention_mask, position_ids, inputs_embeds, past_tokens, token_type_ids
        )
        packed = self.packed(position_ids, attention_mask, hidden_states.shape[0], states, kwargs)
        cross = self.cross_attention_inputs(encoder_hidden_states, encoder_attention_mask, cache)
        source_mask = self.source_mask(hidden_states, encoder_hidden_states, encoder_attention_mask)
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        # the mask as the causal poolings add it to their logits, made once for every layer
        logits_mask = token_mask = None
        if attention_mask is not None:
            dtype = accumulation_dtype(compute_dtype(hidden_states))
            logits_mask = causal_mask(attention_mask, dtype)
            if self.config.convolution_kernel:
                token_mask = attention_mask.to(hidden_states.dtype)
        options = dict(output_attentions=output_attentions, packed=packed, token_mask=token_mask)
        for index, layer in self.applied_layers():
            options["cache_layer"] = None if states is None else states.layers[index]
            key, value = cross[index % len(self.layers)]
            hidden_states = layer(hidden_states, logits_mask, key, value, source_mask, **options)
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=hidden_states, cache=cache)


class FastformerGenerativeModel(FastformerPreTrainedModel, GenerationMixin):
    """What the generative heads share: a decoder whose cache is a recurrent state."""

    _supported_generation_modes = ("greedy_search", "sample", "beam_search", "beam_sample")

    def __init__(self, config: FastformerConfig):
        if config.embedding_width != config.hidden_size:
            raise ValueError(
                f"{type(self).__name__} needs embedding_size == hidden_size (its LM head is the "
                f"word embedding matrix), got embedding_size={config.embedding_size}, "
                f"hidden_size={config.hidden_size}"
            )
        super().__init__(config)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def prepare_inputs_for_generation(self, input_ids, cache=None, is_first_iteration=False, **kwargs):
        """As transformers', continuing from a returned cache as `tokens_to_continue` says."""
        if is_first_iteration and cache is not None and cache.get_seq_length() > 0:
            new_tokens = self.tokens_to_continue(cache, input_ids, kwargs)
            if new_tokens is not None:
                kwargs["next_sequence_length"] = new_tokens
        inputs = super().prepare_inputs_for_generation(
            input_ids, cache=cache, is_first_iteration=is_first_iteration, **kwargs
        )
        # the causal LM's mask cut to the new tokens: every step has the same shapes (CUDA graphs)
        mask, seen = inputs.get("attention_mask"), 0 if cache is None else cache.get_seq_length()
        causal = not self.config.is_encoder_decoder
        if causal and seen and mask is not None and "position_ids" in inputs:
            inputs["attention_mask"] = mask[:, seen:]
        return inputs

    def tokens_to_continue(self, cache, input_ids, kwargs) -> int | None:
        """The input tokens to run when continuing from `cache` (None: as generate() decides)."""
        seq2seq = self.config.is_encoder_decoder
        name = "decoder_input_ids" if seq2seq else "input_ids"
        seen, length = cache.get_seq_length(), input_ids.shape[1]
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if any(getattr(layer, "holds_beams", False) for layer in states.layers):
            raise ValueError(
                "This cache comes from beam search: it holds the state of every beam at the last "
                "step, not of the returned sequences. Continue from a cache of greedy search or "
                "sampling, or without a cache"
            )
        mask = kwargs.get("decoder_attention_mask" if seq2seq else "attention_mask")
        if mask is None and seq2seq and length > seen:
            return length - seen
        # generate() leaves out the cached tokens where the input is as wide as its mask
        new_tokens = kwargs.get("next_sequence_length")
        width = (mask if mask is not None else kwargs.get("position_ids", input_ids)).shape[-1]
        # generate() prepends `decoder_start_token_id` where it lacks (and widens the mask)
        start = self.config.decoder_start_token_id
        prepended = seq2seq and length > 1 and bool((input_ids[:, 0] == start).all())
        whole = width == length and length > seen
        cached_and_new = mask is not None and width == seen + length and not prepended
        if (new_tokens is None or new_tokens > 0) and (mask is None or whole or cached_and_new):
            return new_tokens
        also = ", or only the new tokens with a mask of the cached and new tokens"
        raise ValueError(
            f"Generation continues from a cache that has read {seen} tokens, but `{name}` has "
            f"{length} and its attention mask {width}: pass the whole sequence so far (the "
            "`sequences` generate() returned, then the new tokens) with a mask as wide or "
            f"none{'' if seq2seq else also}"
        )


@auto_docstring(custom_intro="The bare Fastformer encoder-decoder, as BART's `BartModel`.")
class FastformerSeq2SeqModel(FastformerPreTrainedModel):
    base_model_prefix = "model"
    _no_split_modules = ["FastformerLayer", "FastformerDecoderLayer"]

    def __init__(self, config: FastformerConfig):
        super().__init__(config.for_encoder_decoder())
        self.encoder = FastformerModel(self.config, add_pooling_layer=False)
        self.decoder = FastformerDecoder(self.config, cross_attention=True)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        if not self.config.tie_encoder_embeddings:
            return {}
        embeddings = "embeddings.word_embeddings.weight"
        return {f"decoder.{embeddings}": f"encoder.{embeddings}"}

    def get_input_embeddings(self):
        return self.encoder.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.encoder.set_input_embeddings(value)  # the decoder's are tied to them where shared

    @can_return_tuple
    @auto_docstring
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqModelOutput:
        r"""
        decoder_position_ids (`torch.LongTensor`, *optional*):
            The decoder tokens' positions; by default counted over `decoder_attention_mask`.
        cache (`EncoderDecoderCache`, *optional*):
            The generation state to continue: a constant-size pooled state, not keys and values.
        """
        use_cache = use_cache if use_cache is not None else self.config.use_cache
        # a given cache checked before the encoder runs: PEFT's prefix tuning passes keys and values with a
        # mask widened for them, which the encoder would refuse with a message about the mask
        target = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
        if cache is not None and encoder_outputs is None and target is not None:
            cache = self.decoder.checked_cache(cache, use_cache, target.shape[0])
        if encoder_outputs is None:
            rows = None if position_ids is None else position_ids.shape[0]
            if self.encoder.packed_sequences(position_ids, attention_mask, rows) is not None:
                raise ValueError(
                    "The source rows are packed (`position_ids` restart without an attention "
                    "mask), which the encoder-decoder does not take apart: pad the sequences to a "
                    "batch"
                )
            args = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
            encoder_outputs = self.encoder(*args, return_dict=True, **kwargs)
        elif isinstance(encoder_outputs, (tuple, list)):  # from return_dict=False
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            return_dict=True,
            **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


@auto_docstring(
    custom_intro="""
    `FastformerSeq2SeqModel` with a language-modeling head, as BART's: a decoding step costs the
    same at any output length. Its `decoder_attentions` are the causal pooling weights
    (B, H, 2, T, T), which need the whole input in one pass (no cache).
    """
)
class FastformerForConditionalGeneration(FastformerGenerativeModel):
    base_model_prefix = "model"
    _no_split_modules = ["FastformerLayer", "FastformerDecoderLayer"]
    accepts_loss_kwargs = True

    def __init__(self, config: FastformerConfig):
        super().__init__(config.for_encoder_decoder())
        self.model = FastformerSeq2SeqModel(self.config)
        self.lm_head = nn.Linear(self.config.hidden_size, self.config.vocab_size, bias=False)
        self.post_init()

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        source = "encoder" if self.config.tie_encoder_embeddings else "decoder"
        return {"lm_head.weight": f"model.{source}.embeddings.word_embeddings.weight"}

    def get_encoder(self, modality=None):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    @merge_with_config_defaults
    @can_return_tuple
    @auto_docstring
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        decoder_position_ids: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: EncoderDecoderCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        decoder_position_ids (`torch.LongTensor`, *optional*):
            The decoder tokens' positions; by default counted over `decoder_attention_mask`.
        cache (`EncoderDecoderCache`, *optional*):
            The generation state to continue (a pooled state), not returned with `labels`.
        num_items_in_batch (`int` or `torch.Tensor`, *optional*):
            The labelled tokens of a whole gradient accumulation step, which the loss is divided by.
        """
        if labels is not None:
            use_cache = False
            shape = None if decoder_input_ids is None else decoder_input_ids.shape
            labels = checked_token_labels(labels, self.config, shape)
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.shift_labels_right(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            decoder_position_ids=decoder_position_ids,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
        loss = None
        if labels is not None:  # aligned with the logits already (no shift): the masked-LM loss
            items = num_items_in_batch
            loss = ForMaskedLMLoss(logits, labels, self.config.vocab_size, num_items_in_batch=items)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache if use_cache else None,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True) -> nn.Embedding:
        """As transformers', and the decoder's word embeddings too where they are its own."""
        resize = super().resize_token_embeddings
        embeddings = resize(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder, size = self.get_decoder(), embeddings.num_embeddings
        old = decoder.get_input_embeddings()
        if old.num_embeddings != size:  # not tied to the encoder's
            new = self._get_resized_embeddings(old, size, mean_resizing=mean_resizing)
            decoder.set_input_embeddings(new)
        return embeddings

    def shift_labels_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Teacher forcing's inputs: `decoder_start_token_id`, then the labels but the last."""
        if self.config.decoder_start_token_id is None or self.config.pad_token_id is None:
            raise ValueError("Set `decoder_start_token_id` and `pad_token_id` in the config to train from `labels`")
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
        return self.shift_labels_right(labels)


@auto_docstring(
    custom_intro="""
    A decoder-only Fastformer language model: `FastformerForConditionalGeneration`'s decoder without
    cross-attention (whose keywords are refused), generating with the same constant-size state.
    """
)
class FastformerForCausalLM(FastformerGenerativeModel):
    base_model_prefix = "decoder"
    _tied_weights_keys = {"lm_head.weight": "decoder.embeddings.word_embeddings.weight"}
    _no_split_modules = ["FastformerDecoderLayer"]
    accepts_loss_kwargs = True

    def __init__(self, config: FastformerConfig):
        if config.is_encoder_decoder:
            # a seq2seq checkpoint's embeddings are under the encoder: they would be left random
            raise ValueError(
                "This config is an encoder-decoder's (is_encoder_decoder=True): load the "
                "checkpoint with FastformerForConditionalGeneration / AutoModelForSeq2SeqLM, not "
                "FastformerForCausalLM"
            )
        super().__init__(config)
        self.decoder = FastformerDecoder(config, cross_attention=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    @merge_with_config_defaults
    @can_return_tuple
    @auto_docstring
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        token_type_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The token types of these tokens only (not the cached ones); none reads as all zeros.
        cache (`DynamicCache`, *optional*):
            The generation state to continue (a pooled state), not returned with `labels`.
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            Usually the input ids, -100 where ignored; the loss shifts them (t predicts t + 1).
        num_items_in_batch (`int` or `torch.Tensor`, *optional*):
            The labelled tokens of a whole gradient accumulation step, which the loss is divided by.
        """
        check_keywords(kwargs, type(self).__name__, causal=True)
        if labels is not None:
            use_cache = False
            shape = None if input_ids is None else input_ids.shape
            labels = checked_token_labels(labels, self.config, shape)
        args = (input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds)
        outputs = self.decoder(*args, cache=cache, use_cache=use_cache, return_dict=True, **kwargs)
        logits = self.lm_head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
        loss = None
        if labels is not None:
            options = dict(vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch)
            loss = self.loss_function(logits, labels, **options)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=outputs.cache if use_cache else None,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


# checkpoints name the encoder `fastformer.`, as the encoder heads do: renamed on load and save
register_checkpoint_conversion_mapping(
    "FastformerForConditionalGeneration",
    [WeightRenaming(rf"^{name}\.", f"model.{name}.") for name in ("fastformer", "decoder")],
    overwrite=True,
)
register_checkpoint_conversion_mapping(
    "FastformerSeq2SeqModel",
    [WeightRenaming(r"^(embeddings|layers)\.", r"encoder.\1."), WeightRenaming(r"^fastformer\.", "encoder.")],
    overwrite=True,
)

__all__ = [
    "FastformerCacheLayer",
    "FastformerForCausalLM",
    "FastformerForConditionalGeneration",
    "FastformerForMaskedLM",
    "FastformerForSequenceClassification",
    "FastformerModel",
    "FastformerPreTrainedModel",
    "FastformerSeq2SeqModel",
]
