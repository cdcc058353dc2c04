"""Fastformer models for transformers: the encoder, its task heads, and the generation models.

Class chain: FastformerAttention -> FastformerLayer -> FastformerPreTrainedModel -> FastformerModel ->
FastformerFor<Task>. The layer is BERT-style post-LN, as in the authors' code: additive attention (with the
output transform W_r and, unless `config.query_residual` is False, the query residual) -> dense -> dropout ->
add & LayerNorm -> feed-forward -> add & LayerNorm. The decoder (FastformerForConditionalGeneration,
FastformerForCausalLM) uses the causal version of the attention, whose constant-size state FastformerCache
(transformers' linear-attention cache layers) carries during generation; an encoder-decoder keeps its
cross-attention keys and values in an EncoderDecoderCache beside it, as BART does. This file imports the package
only relatively, so a saved checkpoint carries it as Hub code.
"""

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache, LinearAttentionLayer
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.masking_utils import create_bidirectional_mask, find_packed_sequence_indices
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithCrossAttentions,
    BaseModelOutputWithPooling,
    CausalLMOutputWithPast,
    MaskedLMOutput,
    Seq2SeqLMOutput,
    SequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, slice_logits_to_keep
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, logging
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
from .configuration_fastformer import FastformerConfig
from .copy_head import CopyHeadSourceMixin, FastformerCopyHead, SourceContext, SpanGate
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
    if torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device):  # "meta" has no autocast
        return torch.get_autocast_dtype(device)
    return hidden_states.dtype


class FastformerTokenTypeEmbeddings(nn.Embedding):
    """BERT's token type (segment) embeddings: `config.type_vocab_size` rows of `config.embedding_width`. They start at
    zero, drawing no random numbers (a seeded model draws the weights it would without them, and a checkpoint saved
    without them gives its outputs for any `token_type_ids`), and are learned; row 0 stays zero (no gradient)."""

    def __init__(self, config: FastformerConfig):
        size = (config.type_vocab_size, config.embedding_width)
        super().__init__(*size, padding_idx=0, _weight=torch.zeros(size))


class FastformerEmbeddings(nn.Module):
    """Token + learned position + token type (segment) embeddings, LayerNorm, dropout; then a projection to
    `hidden_size` where `config.embedding_size` differs (as ELECTRA's `embeddings_project`).

    Token type 0's embedding is zero, so no `token_type_ids` reads as all zeros: without gradients nothing is looked up
    for them; with gradients type 0 is looked up all the same, so that the table takes part in every backward, as DDP
    (without `find_unused_parameters`) and FSDP expect of every parameter. With `token_types=False` (the
    encoder-decoder's decoder, as BART's) there is no table."""

    def __init__(self, config: FastformerConfig, token_types: bool = True):
        super().__init__()
        size = config.embedding_width
        self.word_embeddings = nn.Embedding(config.vocab_size, size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, size)
        self.token_type_embeddings = None
        if token_types:
            self.token_type_embeddings = FastformerTokenTypeEmbeddings(config)
            # type 0, what no `token_type_ids` read as, expanded to every token (as BERT's `token_type_ids` buffer)
            self.register_buffer("token_type_zero", torch.zeros(1, 1, dtype=torch.long), persistent=False)
        self.layer_norm = nn.LayerNorm(size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.projection = nn.Linear(size, config.hidden_size) if size != config.hidden_size else None

    def forward(self, input_ids=None, position_ids=None, inputs_embeds=None, token_type_ids=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        table = self.token_type_embeddings
        if token_type_ids is None and table is not None and table.weight.requires_grad and torch.is_grad_enabled():
            token_type_ids = self.token_type_zero.expand(embeddings.shape[:2])
        if token_type_ids is not None:
            embeddings = embeddings + table(token_type_ids)
        embeddings = self.dropout(self.layer_norm(embeddings))
        return embeddings if self.projection is None else self.projection(embeddings)


class FastformerAttention(nn.Module):
    """Additive attention over all heads (Eqs. 3-6), then r_i = W_r u_i and the query residual r_i + q_i
    (`config.query_residual`)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        hidden_size = config.hidden_size
        if hidden_size % config.num_attention_heads:
            raise ValueError(
                f"The hidden size ({hidden_size}) is not a multiple of the number of attention heads "
                f"({config.num_attention_heads})"
            )
        self.num_heads = config.num_attention_heads
        self.head_dim = hidden_size // self.num_heads
        self.interaction = config.interaction
        self.query_residual = config.query_residual

        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        # query-value sharing: v_i = q_i, so there is no W_v at all
        self.value = None if config.share_query_value else nn.Linear(hidden_size, hidden_size)
        self.transform = nn.Linear(hidden_size, hidden_size)  # W_r

        # w_q and w_k are Fastformer's only per-head parameters; head-wise sharing keeps one of each
        heads = 1 if config.share_heads else self.num_heads
        self.query_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        self.key_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        if config.interaction == "concat":
            self.query_key_projection = nn.Parameter(torch.empty(heads, 2 * self.head_dim, self.head_dim))
            self.key_value_projection = nn.Parameter(torch.empty(heads, 2 * self.head_dim, self.head_dim))
        else:
            self.query_key_projection = self.key_value_projection = None

    def _per_head(self, parameter):
        if parameter is None or parameter.shape[0] == self.num_heads:
            return parameter
        return parameter.expand(self.num_heads, *parameter.shape[1:])  # head-wise sharing

    def _split_heads(self, x):  # (B, N, H*D) -> (B, H, N, D)
        return x.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def _project(self, hidden_states):
        """The query (kept whole for the residual) and the per-head queries, keys and values."""
        query = self.query(hidden_states)  # (B, N, H*D)
        q, k = self._split_heads(query), self._split_heads(self.key(hidden_states))
        v = q if self.value is None else self._split_heads(self.value(hidden_states))  # query-value sharing
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
        """The attention's output and, with `output_attentions`, its two pooling distributions (B, H, 2, N), else
        None. attention_mask: (B, N), or its `functional.PoolingMask` (made once per forward by the model). With
        `segment_ids` (B, N), the rows are packed: each sequence of a row attends to itself alone
        (`functional.packed_additive_attention`)."""
        query, q, k, v = self._project(hidden_states)
        vectors, settings = self._attention_arguments()
        if segment_ids is None:
            u, weights = additive_attention(
                q, k, v, *vectors, attention_mask, return_weights=output_attentions, **settings
            )
        else:
            u, weights = packed_additive_attention(
                q, k, v, *vectors, segment_ids, return_weights=output_attentions, **settings
            )
        return self._output(u, query), weights


class FastformerShortConvolution(nn.Module):
    """The decoder attention's input with its recent past (`config.decoder_conv_kernel`): every token plus a learned
    depthwise convolution of it and the K - 1 tokens before it (`functional.causal_convolution`; `weight` (D, 1, K)
    as a depthwise `nn.Conv1d`'s), initialized as the other weights (normal, `config.initializer_range`): started at
    zero, the identity, its weights stayed near zero through the recipe (docs/RESULTS.md). With a cache it continues
    from the layer application's last K - 1 inputs, and packed rows convolve each sequence alone. Padding reads as
    zero inputs: at the start of a prompt or the end of a training row, where the padding is, a sequence gets what it
    has alone."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(config.hidden_size, 1, config.decoder_conv_kernel))

    def forward(self, hidden_states, token_mask=None, cache=None, layer_idx=None, packed=None):
        if packed is not None:  # a sequence a row, zeros after its end
            rows = unpack(hidden_states[:, None], packed)
            return repack(causal_convolution(rows[:, 0], self.weight)[0][:, None], packed)[:, 0]
        state = None if cache is None else cache.conv_state(layer_idx)
        out, new_state = causal_convolution(hidden_states, self.weight, token_mask, state)
        if state is not None and not torch.is_grad_enabled():
            state.copy_(new_state)  # in place, as the attention's state: its address stays, for CUDA graphs
        elif cache is not None:
            cache.update_conv_state(new_state, layer_idx)
        return out


class FastformerCausalAttention(FastformerAttention):
    """The decoder's attention: every position pools its prefix only. With a `cache` (a `FastformerCache`), the
    state of layer application `layer_idx` continues a sequence and is updated. With `packed` (`PackedRows`), the
    rows hold several sequences each, and every one pools its own prefix only.

    Returns the output and, with `output_attentions`, the two poolings' weights (B, H, 2, N, N) (row t: the
    weights of tokens 1..t; `functional.causal_pooling_weights`), else None. They need the whole sequence in one
    call: a cache that holds earlier tokens keeps their pooled state, not the tokens.

    With `config.decoder_conv_kernel`, the queries, keys and values are projected from `FastformerShortConvolution`'s
    output; `token_mask` (B, T): 1 for tokens, 0 for padding, in the hidden states' dtype (None: no padding)."""

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.convolution = FastformerShortConvolution(config) if config.decoder_conv_kernel else None

    def forward(
        self,
        hidden_states,
        attention_mask=None,
        cache=None,
        layer_idx=None,
        output_attentions=False,
        packed=None,
        token_mask=None,
    ):
        if output_attentions and cache is not None and cache.attention_state(layer_idx) is not None:
            # refused before the convolution moves its state on: the cache stays as it was
            raise ValueError(
                "`output_attentions=True` needs the decoder's whole sequence in one forward pass, but the cache holds "
                "earlier tokens as a pooled state, without their weights: run without a cache (use_cache=False, as "
                "in generate(..., use_cache=False))"
            )
        if self.convolution is not None:
            hidden_states = self.convolution(hidden_states, token_mask, cache, layer_idx, packed)
        query, q, k, v = self._project(hidden_states)
        vectors, settings = self._attention_arguments()
        if packed is not None:  # a sequence a row (S, H, L, D), the rows' mask; back to packed rows after
            q, k, v = (unpack(x, packed) for x in (q, k, v))
            attention_mask = packed.mask
        state = None if cache is None else cache.attention_state(layer_idx)
        # without gradients, a step writes the state into the cache's tensors: their addresses stay, for CUDA graphs
        in_place = state is not None and not torch.is_grad_enabled()
        u, state, weights = causal_additive_attention(
            q,
            k,
            v,
            *vectors,
            attention_mask,
            state,
            return_weights=output_attentions,
            state_in_place=in_place,
            **settings,
        )
        if cache is not None and not in_place:
            cache.update_attention_state(state, layer_idx)
        if packed is not None:
            u = repack(u, packed)
        return self._output(u, query), weights


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Unpack[TransformersKwargs],
):
    """Softmax attention written out, as transformers' models write it: `attn_implementation="eager"`.
    query (B, H, T, D), key and value (B, H, M, D), attention_mask an additive (B, 1, T, M) float mask; returns
    the output (B, T, H, D) and the weights (B, H, T, M)."""
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        weights = weights + attention_mask
    weights = nn.functional.softmax(weights, dim=-1)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


class FastformerCrossAttention(nn.Module):
    """Decoder tokens read the encoder output (`config.cross_attention_type`).

    "softmax": multi-head scaled dot-product attention over the encoder's keys and values, through transformers'
    attention functions (`config._attn_implementation`: "sdpa" by default, or "eager", as BART's).
    "additive": c = sum_j softmax_j(w_c . v_j / sqrt(d)) v_j per head, pooled from the encoder once; token t
    gets c * q_t.
    `encode` computes what depends on the encoder only, as a (key, value) pair that an `EncoderDecoderCache`
    keeps: the keys and values of the source, or for "additive" the pooled context c as a one-position pair
    (key and value alike; only the value is read).
    """

    is_causal = False  # read by transformers' attention functions

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config  # the attention function is looked up at every call, as in transformers' models
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.scaling = self.head_dim**-0.5
        self.cross_attention_type = config.cross_attention_type
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        if self.cross_attention_type == "softmax":
            self.key = nn.Linear(config.hidden_size, config.hidden_size)
        else:
            self.context_weight = nn.Parameter(torch.empty(self.num_heads, self.head_dim))  # w_c

    def _split_heads(self, x):  # (B, N, H*D) -> (B, H, N, D)
        return x.view(*x.shape[:2], self.num_heads, self.head_dim).transpose(1, 2)

    def encode(self, encoder_hidden_states, encoder_attention_mask=None) -> tuple[torch.Tensor, torch.Tensor]:
        value = self._split_heads(self.value(encoder_hidden_states))  # (B, H, M, D)
        if self.cross_attention_type == "additive":
            context, _ = additive_pooling(value, self.context_weight, encoder_attention_mask, return_weights=False)
            context = context.unsqueeze(-2)  # (B, H, D) -> (B, H, 1, D)
            return context, context
        return self._split_heads(self.key(encoder_hidden_states)), value

    def forward(self, hidden_states, key, value, source_mask=None, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """`source_mask`: what transformers' `create_bidirectional_mask` makes for the attention function. Returns
        the output and the attention weights (B, H, T, M) where the attention function gives them ("eager"; with
        `output_attentions` "sdpa" warns that it gives None, as for transformers' models)."""
        query = self._split_heads(self.query(hidden_states))  # (B, H, T, D)
        if self.cross_attention_type == "additive":
            if kwargs.get("output_attentions"):
                raise ValueError(
                    'cross_attention_type="additive" pools the source once, before any decoder token: it has no '
                    "cross-attention weights per token to return (`output_attentions=True`); the softmax "
                    "cross-attention has them"
                )
            out, weights = (value * query).transpose(1, 2), None  # value: the pooled context c, (B, H, 1, D)
        else:
            attention: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
            out, weights = attention(self, query, key, value, source_mask, scaling=self.scaling, dropout=0.0, **kwargs)
        return out.reshape(hidden_states.shape), weights  # (B, T, H, D) -> (B, T, H*D)


class FastformerSublayerOutput(nn.Module):
    """dense -> dropout -> add the sub-layer's input -> LayerNorm (post-LN, as BERT and the authors' code)."""

    def __init__(self, config: FastformerConfig, input_size: int):
        super().__init__()
        self.dense = nn.Linear(input_size, config.hidden_size)
        self.dropout = config.hidden_dropout_prob  # functional, as BART: one module call less per sub-layer
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, hidden_states, residual) -> torch.Tensor:
        return self.add_and_norm(self.dense(hidden_states), residual)

    def add_and_norm(self, projected, residual) -> torch.Tensor:
        """The sub-layer after `dense`, for a caller that applied `dense` itself (`FastformerLayer`)."""
        projected = nn.functional.dropout(projected, p=self.dropout, training=self.training)
        return self.layer_norm(residual + projected)


class FastformerFeedForward(nn.Module):
    """intermediate -> activation -> dense -> add & LayerNorm, token by token. A batch of more than
    `config.chunk_size_feed_forward` tokens (read at every call; 0, the default: never) runs in chunks of that many
    tokens, rows flattened (so any length takes any chunk size, unlike transformers' `apply_chunking_to_forward`,
    which checkpoints saved with a chunk size of 256 would refuse most lengths with), with and without gradients:
    without, the (tokens x intermediate_size) activations are never held for all tokens at once."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.output = FastformerSublayerOutput(config, config.intermediate_size)

    def forward(self, hidden_states) -> torch.Tensor:
        chunk = self.config.chunk_size_feed_forward
        tokens = hidden_states.shape[0] * hidden_states.shape[1]
        # traced (compile, export): a symbolic length, which the comparison with the chunk would pin; no chunks
        traced = torch.compiler.is_compiling() or torch.compiler.is_exporting()
        if chunk and not traced and tokens > chunk:
            flat = hidden_states.reshape(tokens, hidden_states.shape[-1])
            return torch.cat([self.chunk_forward(part) for part in flat.split(chunk)]).view_as(hidden_states)
        return self.chunk_forward(hidden_states)

    def chunk_forward(self, hidden_states) -> torch.Tensor:
        return self.output(self.activation(self.intermediate(hidden_states)), hidden_states)


class FastformerLayer(GradientCheckpointingLayer):
    """Additive attention -> dense -> add & LayerNorm -> feed-forward -> add & LayerNorm.

    The attention sub-layer (attention up to the output dense) is computed one of two exact ways, chosen by
    `config.additive_attention_mode` (read at every call, so it can be switched on a loaded model):
    - "plain": the paper's steps (`FastformerAttention`, then `attention_output.dense`);
    - "collapsed": the same function with the Linear layers folded into one matrix per sequence
      (`collapsed_attention`; "product" interaction only);
    - "auto" (default): "collapsed" where it applies and repays building its matrix, "plain" otherwise
      (`uses_collapsed_attention`); while torch.export traces (a length of any value), "collapsed" where it applies.
    The layer owns the choice because the folding reads weights of both `attention` and `attention_output`.
    """

    # "auto" folds only batches of at least this many tokens per hidden unit: below, a GPU's time goes to launching
    # kernels (the plain path launches fewer) more than to the GEMMs that folding saves
    collapse_min_tokens_per_unit = 16

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config
        self.attention = FastformerAttention(config)
        self.attention_output = FastformerSublayerOutput(config, config.hidden_size)
        self.feed_forward = FastformerFeedForward(config)

    def folds_plain_linears(self) -> bool:
        """Whether the maps "collapsed" folds are plain `nn.Linear`s with their weights at hand: its folding reads
        their weights (and the attention's w_q, w_k) outside their forward, which a wrapped layer (a PEFT adapter, a
        quantized layer) does not apply alone, and which an offloaded layer holds on "meta" (a device map's offload:
        accelerate loads the weights around the module's own forward only)."""
        attention, dense = self.attention, self.attention_output.dense
        maps = (attention.query, attention.key, attention.value, attention.transform, dense)
        plain = all(type(linear) is nn.Linear for linear in maps if linear is not None)
        parameters = (parameter for module in (attention, dense) for parameter in module.parameters())
        return plain and not any(parameter.is_meta for parameter in parameters)

    def uses_collapsed_attention(self, hidden_states) -> bool:
        """ "auto": the collapsed path where it applies ("product" interaction, plain Linear layers) and repays what it
        costs. Per sequence of N tokens (hidden size C) it builds a (C x C) matrix, 2 C^3 multiply-adds, and saves
        three of the plain path's four (N x C) by (C x C) products, 6 N C^2: it repays from N = C / 2 on, and
        with gradients, whose backward builds the matrix's gradient as well, from N = C. And only for batches of at
        least `collapse_min_tokens_per_unit` * C tokens, where the GEMMs, not the kernel launches, set the time.
        While torch.export traces, the batch and the length may be symbolic, and a rule on them would hold the graph
        to one side of it: "auto" then takes the collapsed path wherever it applies, as `fastformer.export` does."""
        mode = self.config.additive_attention_mode
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
        if mode == "collapsed" and self.config.interaction != "product":
            raise ValueError(
                'additive_attention_mode="collapsed" folds the "product" interaction\'s linear maps and needs '
                f'interaction="product", got interaction={self.config.interaction!r}; use "auto" or "plain"'
            )
        if mode == "collapsed" and not self.folds_plain_linears():
            raise ValueError(
                'additive_attention_mode="collapsed" folds the attention\'s nn.Linear weights, but some are wrapped '
                "(e.g. by a PEFT adapter or by quantization), whose output the folding would skip, or offloaded by a "
                'device map (on "meta" outside their forward); use "auto" or "plain"'
            )
        return mode == "collapsed"

    def forward(self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False):
        """Returns the new hidden states and, with `output_attentions`, the attention's two pooling distributions
        (B, H, 2, N), else None (what `capture_outputs` records as `attentions`). attention_mask: (B, N) or its
        `functional.PoolingMask`; `segment_ids`: packed rows' sequences (`FastformerAttention`)."""
        hidden_states, weights = self.attention_sublayer(hidden_states, attention_mask, segment_ids, output_attentions)
        return self.feed_forward(hidden_states), weights

    def attention_sublayer(self, hidden_states, attention_mask=None, segment_ids=None, output_attentions=False):
        """The first half of the layer: attention -> dense -> dropout -> add & LayerNorm (what a BERT layer's
        `attention` module computes; `fastformer.distillation` matches the two). Returns it and the weights (None
        unless `output_attentions`). Packed rows take the plain path: the collapsed one folds the maps into one
        matrix per row."""
        if segment_ids is None and self.uses_collapsed_attention(hidden_states):
            projected, weights = self.collapsed_attention(hidden_states, attention_mask, output_attentions)
        else:
            attention, weights = self.attention(hidden_states, attention_mask, segment_ids, output_attentions)
            projected = self.attention_output.dense(attention)
        return self.attention_output.add_and_norm(projected, hidden_states), weights

    def collapsed_attention(self, hidden_states, attention_mask=None, output_attentions=False):
        """`attention_output.dense(attention(...))` for the "product" interaction, with the Linear layers folded.

        The global query and key come from `pool_projections` (so q_i, k_i and p_i are never formed), and then
        everything left is linear in x_i given the global key k:
            dense(r_i + q_i) = W_o (W_r (k * (W_v x_i + b_v)) + b_r + W_q x_i + b_q) + b_o = M x_i + m
            M = (W_o W_r) diag(k) W_v + W_o W_q,    m = W_o (W_r (k * b_v) + b_r + b_q) + b_o
        (without the query residual, `config.query_residual=False`, the W_q x_i + b_q terms drop out)
        so the sub-layer costs one (N x C) by (C x C) product per sequence instead of five, and stores no
        (N x C) activation besides x. M depends on the sequence (through k): a (C x C) product per sequence.
        Returns it and, with `output_attentions`, the pooling weights (B, H, 2, N), else None.
        """
        attention, dense = self.attention, self.attention_output.dense
        batch, _, hidden_size = hidden_states.shape
        query, key = attention.query, attention.key
        value = query if attention.value is None else attention.value
        (query_weight, key_weight), _ = attention._attention_arguments()
        pooled = partial(
            pool_projections, hidden_states, attention_mask=attention_mask, return_weights=output_attentions
        )
        global_query, alpha = pooled(query.weight, query.bias, query_weight)
        key_weight = key_weight * global_query  # w_k . (q * k_i) = (w_k * q) . k_i
        pooled_key, beta = pooled(key.weight, key.bias, key_weight)
        global_key = (global_query * pooled_key).reshape(batch, 1, hidden_size)  # sum_i beta_i (q * k_i)

        out_transform = dense.weight @ attention.transform.weight  # W_o W_r
        matrix = (out_transform * global_key) @ value.weight  # (B, C, C)
        inner_bias = (global_key * value.bias) @ attention.transform.weight.T + attention.transform.bias
        if attention.query_residual:
            matrix = matrix + dense.weight @ query.weight
            inner_bias = inner_bias + query.bias
        bias = inner_bias @ dense.weight.T + dense.bias  # (B, 1, C)
        out = torch.baddbmm(bias, hidden_states, matrix.transpose(1, 2))
        return out, torch.stack((alpha, beta), dim=-2) if output_attentions else None


class FastformerDecoderLayer(GradientCheckpointingLayer):
    """Causal Fastformer attention, then (in an encoder-decoder) cross-attention, then the feed-forward block.

    `cross_key`, `cross_value`: `cross_attention.encode(...)` of the encoder output, computed once per distinct
    layer by the caller (positional, so that reentrant gradient checkpointing sends their gradients back once);
    `cache` and `layer_idx`: the generation state of this layer application; `token_mask`: the attention mask as
    the short convolution reads it (`FastformerCausalAttention`).
    """

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
        cache=None,
        layer_idx=None,
        output_attentions=False,
        packed: PackedRows | None = None,
        token_mask=None,
    ):
        attention, _ = self.attention(
            hidden_states, attention_mask, cache, layer_idx, output_attentions, packed, token_mask
        )
        hidden_states = self.attention_output(attention, hidden_states)
        if self.cross_attention is not None:
            cross, _ = self.cross_attention(
                hidden_states, cross_key, cross_value, source_mask, output_attentions=output_attentions
            )
            hidden_states = self.cross_attention_output(cross, hidden_states)
        return self.feed_forward(hidden_states)


class FastformerScoreVector(nn.Module):
    """The additive pooler's score vector s, `weight` (1, hidden_size) as a one-output Linear layer's (no bias: a
    softmax ignores a shift, so its gradient is 0 and Adam would only move it by rounding noise). Its forward hands it
    out as the pooling's query: read inside the module's own forward, as a device map that offloads it needs
    (accelerate loads an offloaded weight around the forward), and left as it is by quantization, which swaps
    nn.Linear layers."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(1, hidden_size))
        # drawn as nn.Linear(hidden_size, 1) draws its weight, so that a seeded model draws the same numbers as with
        # such a Linear layer (`_init_weights` then draws it from the config)
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, keys) -> torch.Tensor:
        """The query of each row of `keys` (B, 1, N, C): (B, 1, 1, C)."""
        # a copy of the score vector, at an aligned address: the CPU kernel sums in an order that follows the
        # query's alignment, which a loaded (memory-mapped) weight does not have, so a reloaded model would differ
        return self.weight.clone().view(1, 1, 1, -1).expand(keys.shape[0], 1, 1, -1)


class FastformerPooler(nn.Module):
    """Pools the last layer into one vector per sequence, ignoring padding (`config.pooler_type`)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.pooler_type = config.pooler_type
        if self.pooler_type == "additive":
            # the paper's attention pooling: a small tanh MLP scores each token
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.score = FastformerScoreVector(config.hidden_size)

    def forward(self, hidden_states, attention_mask=None, mask: PoolingMask | None = None) -> torch.Tensor:
        """attention_mask: (B, N), True for tokens; `mask`: its `functional.PoolingMask` where the caller has made
        one (the additive pooler takes it, else makes it). A row without tokens pools to zeros."""
        if self.pooler_type == "additive":
            # softmax_i(s . tanh(dense(h_i))) weighted sum of the h_i: attention with the score vector s as the one
            # query, one fused kernel
            mask = as_pooling_mask(attention_mask, compute_dtype(hidden_states)) if mask is None else mask
            keys = torch.tanh(self.dense(hidden_states)).unsqueeze(1)  # (B, 1, N, C)
            query = self.score(keys)  # (B, 1, 1, C)
            pooled = nn.functional.scaled_dot_product_attention(
                query, keys, hidden_states.unsqueeze(1), attn_mask=None if mask is None else mask.bias, scale=1.0
            ).view(keys.shape[0], -1)
            return pooled if mask is None else pooled * mask.has_tokens.view(-1, 1)
        if attention_mask is None:
            attention_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        attention_mask = attention_mask.to(torch.bool)
        if self.pooler_type == "cls":
            first_token = attention_mask.int().argmax(dim=-1)  # left padding puts the first token later
            return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), first_token]
        weights = attention_mask / attention_mask.sum(dim=-1, keepdim=True).clamp(min=1)  # "mean"
        return (weights.to(hidden_states.dtype).unsqueeze(1) @ hidden_states).squeeze(1)  # (B, hidden)


class FastformerPreTrainedModel(PreTrainedModel):
    config: FastformerConfig
    base_model_prefix = "fastformer"
    supports_gradient_checkpointing = True
    # the softmax cross-attention goes through transformers' attention functions ("eager" always works)
    _supports_sdpa = True
    # the layers that device maps and FSDP keep whole: only classes a model of this class has (accelerate's FSDP
    # refuses a name it cannot find), and no embeddings (its FSDP2 shards the input embeddings itself, a second
    # time if they were named); the generative heads name theirs
    _no_split_modules = ["FastformerLayer"]
    # every forward (training, inference, a cached decoding step) compiles as one graph (tests/test_compile.py); with a
    # FastformerCache, generate() on a GPU then compiles the decoding steps itself, whose state stays at its addresses
    _can_compile_fullgraph = True
    # what `output_hidden_states` / `output_attentions` collect (transformers' `capture_outputs` hooks): every
    # layer application's output, and the encoder layers' pooling distributions (B, H, 2, N)
    _can_record_outputs = {
        "hidden_states": FastformerLayer,
        "attentions": OutputRecorder(FastformerLayer, index=1),
    }

    def _init_weights(self, module):
        if isinstance(module, (SpanGate, SourceContext)):
            module.init_weights()
            return
        if isinstance(module, FastformerTokenTypeEmbeddings):
            init.zeros_(module.weight)
            return
        if isinstance(module, FastformerEmbeddings) and module.token_type_embeddings is not None:
            init.zeros_(module.token_type_zero)
        super()._init_weights(module)
        if isinstance(module, FastformerCrossAttention) and module.cross_attention_type == "additive":
            init.normal_(module.context_weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, (FastformerShortConvolution, FastformerScoreVector)):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        if isinstance(module, FastformerAttention):
            for parameter in (
                module.query_weight,
                module.key_weight,
                module.query_key_projection,
                module.key_value_projection,
            ):
                if parameter is not None:
                    init.normal_(parameter, mean=0.0, std=self.config.initializer_range)


class FastformerStack(FastformerPreTrainedModel):
    """Embeddings, then `num_layers` applications of `layers` (with `config.share_layers` one layer, applied
    every time): what the encoder (`FastformerModel`) and the decoder (`FastformerDecoder`) have in common.

    An attention mask marks tokens with any non-zero value, padding with 0 (as BERT's). Without `position_ids`,
    positions count real tokens only, so left padding does not shift them, and continue after `past_positions`
    ((B,) real tokens before these, in generation)."""

    input_name = "input_ids"  # for error messages

    def _layers(self, layer_class, num_layers: int, *args) -> nn.ModuleList:
        self.num_layers = num_layers
        distinct = 1 if self.config.share_layers else num_layers
        return nn.ModuleList(layer_class(self.config, *args) for _ in range(distinct))

    def applied_layers(self):
        """(application index, layer) for every layer application, in order."""
        return ((index, self.layers[index % len(self.layers)]) for index in range(self.num_layers))

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @staticmethod
    def packed_sequences(position_ids, attention_mask, batch_size) -> torch.Tensor | None:
        """The sequence of every token (B, N) where the rows are packed, else None: read from `position_ids` that
        restart without an attention mask (one look at their values), as transformers' masks read them. Not while
        a graph is traced (torch.compile, export), where the look would be a graph break: there, pass a mask."""
        if position_ids is None or attention_mask is not None or is_tracing(position_ids):
            return None
        return find_packed_sequence_indices(position_ids.expand(batch_size, -1))

    def embed(
        self,
        input_ids,
        attention_mask,
        position_ids,
        inputs_embeds,
        past_tokens=0,
        past_positions=None,
        token_type_ids=None,
    ):
        """The checked inputs' embeddings (B, N, hidden_size) and their attention mask as booleans; `past_tokens`: the
        columns before these (in generation), which the mask may cover too, as generate() passes it; `token_type_ids`:
        these columns' only, as generate() passes them."""
        batch_size, length = check_inputs(input_ids, inputs_embeds, self.config, self.input_name)
        if token_type_ids is not None:
            if self.embeddings.token_type_embeddings is None:
                raise ValueError(
                    "The encoder-decoder's decoder has no token types (as BART's), but was given `token_type_ids`: "
                    "they are the encoder's (`FastformerForConditionalGeneration`'s `token_type_ids`)"
                )
            check_token_type_ids(token_type_ids, (batch_size, length), self.config.type_vocab_size)
        if past_tokens and attention_mask is not None and attention_mask.shape[-1] == past_tokens + length:
            attention_mask = attention_mask[:, past_tokens:]
        if attention_mask is not None and tuple(attention_mask.shape) != (batch_size, length):
            raise ValueError(
                f"`attention_mask` must have shape (batch, seq_len) = {(batch_size, length)}, got "
                f"{tuple(attention_mask.shape)}{' (it may also cover the cached tokens)' if past_tokens else ''}"
            )
        if attention_mask is not None:
            attention_mask = attention_mask.bool()
        max_positions = self.config.max_position_embeddings
        if position_ids is not None:
            check_position_ids(position_ids, (batch_size, length), max_positions)
            return self.embeddings(input_ids, position_ids, inputs_embeds, token_type_ids), attention_mask
        if attention_mask is None:
            device = (input_ids if input_ids is not None else inputs_embeds).device
            position_ids = torch.arange(length, device=device).expand(batch_size, -1)
        else:
            position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)  # a bool mask's cumsum counts in int64
        if past_positions is not None:
            position_ids = position_ids + past_positions[:, None]
        # every column counts against the table, padding too: whether a row's real tokens fit would take its values
        if past_tokens + length > max_positions:
            name = self.input_name if inputs_embeds is None else self.input_name.replace("input_ids", "inputs_embeds")
            raise ValueError(
                f"The `{name}` sequence reaches more than {max_positions} positions (`max_position_embeddings`): "
                "truncate it, generate fewer tokens or use a config with more positions"
            )
        return self.embeddings(input_ids, position_ids, inputs_embeds, token_type_ids), attention_mask


class FastformerModel(FastformerStack):
    """The bare Fastformer encoder.

    `attentions` (with `output_attentions=True`) holds, per applied layer, the two additive-attention pooling
    distributions as a tensor of shape (batch, num_heads, 2, seq_len): [:, :, 0] is alpha (the weights that
    pool the global query), [:, :, 1] is beta (the weights that pool the global key). Padding gets 0.
    Without `position_ids`, positions count real tokens only, so left padding does not shift them.

    Packed rows (`DataCollatorWithFlattening`: no attention mask, `position_ids` that restart at each sequence, as
    transformers' `find_packed_sequence_indices` reads them) give every sequence the hidden states it has alone;
    `pooler_output` is then None (one vector per row would mix the sequences).
    """

    def __init__(self, config: FastformerConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = FastformerEmbeddings(config)
        self.layers = self._layers(FastformerLayer, config.num_hidden_layers)
        self.pooler = FastformerPooler(config) if add_pooling_layer else None
        self.post_init()

    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithPooling:
        r"""
        token_type_ids: the token types (segments) (B, N), as BERT's: 0 for the first text of a pair, 1 for the
            second; none given reads as all zeros.
        encoder_hidden_states, encoder_attention_mask, cache: BERT's as a decoder; the Fastformer encoder has
            no cross-attention and no generation state, so they are refused (the decoders are
            `FastformerForConditionalGeneration` and `FastformerForCausalLM`).
        use_cache: as BERT's encoder, it has nothing to cache: no effect.
        """
        if encoder_hidden_states is not None or encoder_attention_mask is not None:
            raise ValueError(
                "The Fastformer encoder has no cross-attention (`encoder_hidden_states`, `encoder_attention_mask`): "
                "a decoder that reads an encoder's output is FastformerForConditionalGeneration's"
            )
        if cache is not None:
            raise ValueError(
                f"The Fastformer encoder keeps no generation state, but was given a cache ({type(cache).__name__}); "
                "generation is FastformerForCausalLM's and FastformerForConditionalGeneration's"
            )
        check_keywords(kwargs, type(self).__name__, causal=False)
        hidden_states, attention_mask = self.embed(
            input_ids, attention_mask, position_ids, inputs_embeds, token_type_ids=token_type_ids
        )
        segment_ids = self.packed_sequences(position_ids, attention_mask, hidden_states.shape[0])
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        # the mask as the poolings take it, made once for every layer
        mask = None if attention_mask is None else pooling_mask(attention_mask, compute_dtype(hidden_states))
        for _, layer in self.applied_layers():
            hidden_states, _ = layer(hidden_states, mask, segment_ids, output_attentions)
        pooled = None
        if self.pooler is not None and segment_ids is None:
            pooled = self.pooler(hidden_states, attention_mask, mask)
        return BaseModelOutputWithPooling(last_hidden_state=hidden_states, pooler_output=pooled)


class FastformerForSequenceClassification(FastformerPreTrainedModel):
    """Fastformer with a linear classifier on the pooled output (`config.pooler_type`).

    `config.problem_type` selects the loss as in transformers: "regression" (MSE), "single_label_classification"
    (cross-entropy) or "multi_label_classification" (BCE with logits); inferred from the labels when unset.
    """

    # the loss is the batch's mean, not a sum over `num_items_in_batch`: the Trainer must scale it itself (it would
    # infer the opposite from `**kwargs`, and under DDP scale the gradients by the number of processes)
    accepts_loss_kwargs = False

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.fastformer = FastformerModel(config)
        dropout = config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
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
        outputs = self.fastformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            return_dict=True,
            **kwargs,
        )
        if outputs.pooler_output is None:
            raise ValueError(
                f"{type(self).__name__} gives one prediction per row, but the rows are packed (`position_ids` restart "
                "without an attention mask): pad the sequences to a batch instead of DataCollatorWithFlattening"
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
    """dense -> activation -> LayerNorm -> vocabulary projection (tied to the input embeddings by default); the
    dense layer maps to the width of the embedding matrix (`config.embedding_width`, as ELECTRA's generator)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.embedding_width)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.embedding_width, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.embedding_width, config.vocab_size)

    def forward(self, hidden_states) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.activation(self.dense(hidden_states))))


class FastformerForMaskedLM(FastformerPreTrainedModel):
    """Fastformer with a masked-language-modeling head, for pretraining; labels are -100 where not masked."""

    _tied_weights_keys = {"lm_head.decoder.weight": "fastformer.embeddings.word_embeddings.weight"}
    # the Trainer passes num_items_in_batch, so the loss stays exact under gradient accumulation
    accepts_loss_kwargs = True

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
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> MaskedLMOutput:
        r"""
        encoder_hidden_states, encoder_attention_mask: BERT's as a decoder; refused (`FastformerModel`).
        """
        outputs = self.fastformer(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            labels = checked_token_labels(labels, self.config, shape=logits.shape[:2])
            loss = self.loss_function(
                logits, labels, vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch
            )
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class FastformerCacheLayer(LinearAttentionLayer):
    """The generation state of one decoder layer application, as transformers' linear-attention cache layer: the
    causal attention's `CausalAttentionState` in four recurrent-state slots (the query's pooling, then the key's:
    a (B, H) log normalizer and a (B, H, D) pooled vector each) and, with `config.decoder_conv_kernel` K, the short
    convolution's last K - 1 inputs (B, D, K - 1) in the first convolution-state slot. No state before the first
    token."""

    # a pooled state cannot be rolled back (transformers' linear-attention layers can, from a history they record)
    is_croppable = False

    def __init__(self):
        super().__init__(number_of_states=4)

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        # a new state (a prompt's, or a step's with gradients, through which autograd may go back) is kept as it is,
        # at a static address: the decoding steps without gradients then write into it (`FastformerCausalAttention`),
        # as transformers' layers copy into theirs, so that CUDA graphs replay the same tensors
        if self.device is None:
            self.device, self.dtype = recurrent_states.device, recurrent_states.dtype
        if not is_torchdynamo_compiling():
            torch._dynamo.mark_static_address(recurrent_states)
        self.recurrent_states[state_idx] = recurrent_states
        self.is_recurrent_states_initialized[state_idx] = True
        self.has_previous_state[state_idx] = True
        return recurrent_states

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        """Keeps a new convolution state, the last K - 1 inputs `functional.causal_convolution` returns (a prompt's,
        or a step's with gradients; transformers' layers take the new inputs and join them to the state here), as
        `update_recurrent_state` does: on its own, at a static address (a slice of a longer tensor would keep all of
        it), which the steps without gradients then write into (`FastformerShortConvolution`). Leaves
        `has_previous_state` to the attention."""
        if self.device is None:
            self.device, self.dtype = conv_states.device, conv_states.dtype
        conv_states = conv_states.contiguous()
        if not is_torchdynamo_compiling():
            torch._dynamo.mark_static_address(conv_states)
        self.conv_states[state_idx] = conv_states
        self.conv_kernel_size[state_idx] = conv_states.shape[-1]  # the inputs kept, as transformers counts them
        self.is_conv_states_initialized[state_idx] = True
        return conv_states

    def reset(self) -> None:
        """Empty, as a new layer: the next sequence may have another batch size."""
        for index in range(self.number_of_states):
            self.recurrent_states[index] = self.conv_states[index] = None
            self.is_recurrent_states_initialized[index] = self.is_conv_states_initialized[index] = False
            self.has_previous_state[index] = False

    def _map_rows(self, rows):
        for states, initialized in (
            (self.recurrent_states, self.is_recurrent_states_initialized),
            (self.conv_states, self.is_conv_states_initialized),
        ):
            for index, held in initialized.items():
                if held:
                    states[index] = rows(states[index])

    def batch_select_indices(self, indices: torch.Tensor):
        self._map_rows(lambda tensor: tensor[indices])

    def batch_repeat_interleave(self, repeats: int):
        self._map_rows(lambda tensor: tensor.repeat_interleave(repeats, dim=0))


class FastformerCache(DynamicCache):
    """What a Fastformer decoder needs to continue generating, of a size that does not grow with the number of
    generated tokens: per decoder layer application a `FastformerCacheLayer` (the recurrent state, and with
    `config.decoder_conv_kernel` the short convolution's last inputs), and per row the count of real tokens so far
    (the next position id). An encoder-decoder keeps it as the self-attention part of an `EncoderDecoderCache`,
    whose cross-attention part (a `DynamicCache`) holds the source's keys and values once per distinct decoder
    layer (one with `share_layers`).

    Beam search reorders it. A recurrent state cannot be rolled back (`crop`): the cache is not `is_croppable`,
    so transformers refuses assisted decoding.
    """

    def __init__(self, config: FastformerConfig):
        # a DynamicCache (EncoderDecoderCache's batch methods ask for one) made of Fastformer's layers
        Cache.__init__(self, layers=[FastformerCacheLayer() for _ in range(config.num_decoder_layers)])
        self.seen_tokens = 0  # columns consumed, padding included
        self.positions = None  # (B,) real tokens consumed per row
        self.holds_beams = False  # reordered by beam search: rows are beams, not the returned sequences

    def attention_state(self, layer_idx: int) -> CausalAttentionState | None:
        """Layer application `layer_idx`'s causal attention state, None before the first token."""
        layer = self.layers[layer_idx]
        if not layer.has_previous_state[0]:
            return None
        states = layer.recurrent_states
        return CausalAttentionState(PoolingState(states[0], states[1]), PoolingState(states[2], states[3]))

    def update_attention_state(self, state: CausalAttentionState, layer_idx: int):
        for index, tensor in enumerate(tensor for pooling in state for tensor in pooling):
            self.update_recurrent_state(tensor, layer_idx, index)

    def conv_state(self, layer_idx: int) -> torch.Tensor | None:
        """Layer application `layer_idx`'s short convolution state (B, D, K - 1), None before the first token."""
        layer = self.layers[layer_idx]
        return layer.conv_states[0] if layer.is_conv_states_initialized[0] else None

    def advance(self, attention_mask: torch.Tensor | None, batch_size: int, length: int, device):
        """Counts `length` more columns, and per row the real tokens among them (all, without a mask)."""
        self.seen_tokens += length
        consumed = length if attention_mask is None else attention_mask.sum(dim=-1)
        if self.positions is None:
            self.positions = torch.zeros(batch_size, dtype=torch.long, device=device) + consumed
            if not is_torchdynamo_compiling():
                torch._dynamo.mark_static_address(self.positions)
        else:  # in place, at its static address
            self.positions.add_(consumed)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def _map_positions(self, rows):
        if self.positions is not None:
            self.positions = rows(self.positions)

    def reorder_cache(self, beam_idx: torch.LongTensor):
        super().reorder_cache(beam_idx)
        self.holds_beams = True
        self._map_positions(lambda tensor: tensor.index_select(0, beam_idx.to(tensor.device)))

    def batch_select_indices(self, indices: torch.Tensor):
        super().batch_select_indices(indices)
        self._map_positions(lambda tensor: tensor[indices])

    def batch_repeat_interleave(self, repeats: int):
        super().batch_repeat_interleave(repeats)
        self._map_positions(lambda tensor: tensor.repeat_interleave(repeats, dim=0))

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("FastformerCache holds a recurrent state, which cannot be rolled back (cropped)")

    def reset(self):
        super().reset()
        self.seen_tokens, self.positions, self.holds_beams = 0, None, False


class FastformerEncoderDecoderCache(EncoderDecoderCache):
    """The encoder-decoder's generation cache: a `FastformerCache` and the cross-attention's `DynamicCache`. Beam
    search reorders the decoder's state only: it picks beams among those of the same source, whose cross-attention
    rows are equal copies, so copying every source's keys and values at every step would change nothing."""

    def reorder_cache(self, beam_idx: torch.LongTensor):
        self.self_attention_cache.reorder_cache(beam_idx)


class FastformerDecoder(FastformerStack):
    """Token and position embeddings, then `config.num_decoder_layers` causal Fastformer layers (with
    cross-attention to an encoder output when `cross_attention`). Positions count real tokens only and
    continue from the cache, so left padding and incremental decoding give the same positions as one pass.

    `cache`: a `FastformerCache`, or for cross-attention an `EncoderDecoderCache` of a `FastformerCache` and a
    `DynamicCache` (the source's keys and values, computed on the first step)."""

    # `output_attentions`: per layer application, the causal attention's pooling weights (B, H, 2, T, T) and the
    # softmax cross-attention's weights (B, H, T, M)
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
        self.layers = self._layers(FastformerDecoderLayer, config.num_decoder_layers, cross_attention)
        self.post_init()

    def cross_attention_inputs(self, encoder_hidden_states, encoder_attention_mask, cache):
        """Per distinct layer, the (key, value) its cross-attention reads: from the cross-attention cache after the
        first step, else computed (once per distinct layer, with or without a cache)."""
        if self.layers[0].cross_attention is None:
            return [(None, None)] * len(self.layers)
        cross_cache = cache.cross_attention_cache if isinstance(cache, EncoderDecoderCache) else None
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
        """The softmax cross-attention's mask over the source, as transformers' `create_bidirectional_mask` makes
        it for the attention function in use (None without cross-attention or padding)."""
        softmax = self.layers[0].cross_attention is not None and self.config.cross_attention_type == "softmax"
        if not softmax or encoder_attention_mask is None:
            return None
        mask = encoder_attention_mask.to(torch.bool)
        # a source that is all padding attends to all of it: finite numbers instead of a softmax over nothing
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        if encoder_hidden_states is None:  # a later decoding step: only the source's shape is read
            encoder_hidden_states = hidden_states.new_empty(*mask.shape, 0)
        # no skip of a mask without padding: telling would read the mask's values, a GPU synchronization per step
        return create_bidirectional_mask(
            config=self.config,
            inputs_embeds=hidden_states,
            attention_mask=mask,
            encoder_hidden_states=encoder_hidden_states,
            allow_is_bidirectional_skip=False,
        )

    def packed(self, position_ids, attention_mask, batch_size, states, kwargs) -> PackedRows | None:
        """The `PackedRows` of packed rows (`packed_sequences`), looked for where transformers' masks look: without
        a cache (with one, the rows continue as they are). They train and score: cross-attention and attention
        weights would follow a row, not its sequences, and are refused."""
        if states is not None:
            return None
        segment_ids = self.packed_sequences(position_ids, attention_mask, batch_size)
        if segment_ids is None:
            return None
        refused = {
            "cross-attention": self.layers[0].cross_attention is not None,
            "output_attentions": kwargs.get("output_attentions", self.config.output_attentions),
        }
        if any(refused.values()):
            raise ValueError(
                "The rows are packed (`position_ids` restart without an attention mask), which the decoder takes "
                f"apart without {', '.join(name for name, given in refused.items() if given)}"
            )
        return packed_rows(segment_ids)

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
        cache: FastformerCache | EncoderDecoderCache | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> BaseModelOutputWithCrossAttentions:
        check_keywords(kwargs, type(self).__name__, causal=True)
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        hidden_states, attention_mask = self.embed(
            input_ids,
            attention_mask,
            position_ids,
            inputs_embeds,
            *((0, None) if states is None else (states.seen_tokens, states.positions)),
            token_type_ids=token_type_ids,
        )
        packed = self.packed(position_ids, attention_mask, hidden_states.shape[0], states, kwargs)
        cross_inputs = self.cross_attention_inputs(encoder_hidden_states, encoder_attention_mask, cache)
        source_mask = self.source_mask(hidden_states, encoder_hidden_states, encoder_attention_mask)
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        # the mask as the causal poolings add it to their logits, made once for every layer
        logits_mask = token_mask = None
        if attention_mask is not None:
            logits_mask = causal_mask(attention_mask, accumulation_dtype(compute_dtype(hidden_states)))
            if self.config.decoder_conv_kernel:
                token_mask = attention_mask.to(hidden_states.dtype)
        for index, layer in self.applied_layers():
            key, value = cross_inputs[index % len(self.layers)]
            hidden_states = layer(
                hidden_states,
                logits_mask,
                key,
                value,
                source_mask,
                cache=states,
                layer_idx=index,
                output_attentions=output_attentions,
                packed=packed,
                token_mask=token_mask,
            )
        if states is not None:
            states.advance(attention_mask, *hidden_states.shape[:2], hidden_states.device)
        return BaseModelOutputWithCrossAttentions(last_hidden_state=hidden_states)


class FastformerGenerativeModel(FastformerPreTrainedModel, GenerationMixin):
    """What generate() needs from a model whose decoder carries a recurrent state instead of a KV cache: the
    base of `FastformerForConditionalGeneration` and `FastformerForCausalLM`."""

    _supported_generation_modes = ("greedy_search", "sample", "beam_search", "beam_sample")

    def __init__(self, config: FastformerConfig):
        if config.embedding_width != config.hidden_size:
            raise ValueError(
                f"{type(self).__name__} needs embedding_size == hidden_size (its LM head is the word embedding "
                f"matrix), got embedding_size={config.embedding_size}, hidden_size={config.hidden_size}"
            )
        super().__init__(config)

    @classmethod
    def _supports_default_dynamic_cache(cls) -> bool:
        return False  # the model makes its own FastformerCache on the first forward with use_cache=True

    def checked_cache(self, cache: Cache | None, use_cache: bool) -> Cache | None:
        """The cache this forward reads and updates: the one given, whatever `use_cache` says (as transformers'
        models read it), else a new one with `use_cache`; None while the layers are checkpointed (as transformers'
        `GradientCheckpointingLayer` drops it). An `EncoderDecoderCache` whose self-attention part is an empty
        transformers cache (BART's `EncoderDecoderCache(DynamicCache(), DynamicCache())`) gets the decoder's state in
        its place, so that the caller's object carries on. Refused: any other cache that is not the decoder's
        state (`new_cache()`), as an empty `DynamicCache()` could not be filled in place, and a cache of keys and
        values (PEFT's prefix tuning), which a recurrent state cannot continue from."""
        if self.checkpoints_layers():
            if cache is not None:
                logger.warning_once("Caching is incompatible with gradient checkpointing: the given cache is not read")
            return None
        if cache is None:
            return self.new_cache() if use_cache else None
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if isinstance(states, FastformerCache):
            return cache
        if isinstance(states, Cache) and states.get_seq_length() == 0:
            if isinstance(cache, EncoderDecoderCache):
                cache.self_attention_cache = FastformerCache(self.config)
                return cache
            raise ValueError(
                f"A Fastformer decoder continues from its own state, `model.new_cache()` (a DynamicCache of "
                f"linear-attention layers), not from an empty {type(states).__name__}, which it cannot fill: pass "
                "`cache=model.new_cache()` (generate() takes an empty one and makes its own)"
            )
        raise ValueError(
            f"The cache holds keys and values ({type(states).__name__}), as PEFT's prefix tuning passes them, but "
            "Fastformer's decoder continues from a recurrent state (`model.new_cache()`): prefix tuning is not "
            "supported (prompt tuning and LoRA are)"
        )

    def checkpoints_layers(self) -> bool:
        """Whether this forward checkpoints the layers, which then run without the cache (so none is kept); the
        cheap conditions first: generation, in eval mode or without gradients, never walks the modules."""
        return self.training and torch.is_grad_enabled() and self.is_activation_checkpointing

    def _prepare_cache_for_generation(self, generation_config, model_kwargs, *args, **kwargs):
        """As generate()'s, where an empty transformers cache given to generate() (`DynamicCache()`) makes way for the
        model's own, which the first forward makes (`checked_cache`)."""
        cache = model_kwargs.get("cache")
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if isinstance(states, Cache) and not isinstance(states, FastformerCache) and not states.get_seq_length():
            model_kwargs["cache"] = None if states is cache else self.checked_cache(cache, True)
        return super()._prepare_cache_for_generation(generation_config, model_kwargs, *args, **kwargs)

    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def prepare_inputs_for_generation(
        self,
        input_ids,
        next_sequence_length=None,
        cache=None,
        attention_mask=None,
        inputs_embeds=None,
        is_first_iteration=False,
        **kwargs,
    ):
        """As transformers', and generation that continues from a returned cache takes only the new tokens:
        transformers trims the cached tokens only for caches that count them (attention caches), not for a
        recurrent state."""
        states = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        if is_first_iteration and isinstance(states, FastformerCache) and states.seen_tokens:
            embeds = inputs_embeds is not None and not self.config.is_encoder_decoder
            length = (inputs_embeds if embeds else input_ids).shape[1]
            new_tokens = self.tokens_to_continue(states, input_ids, length, attention_mask, kwargs)
            if new_tokens is not None:
                next_sequence_length = new_tokens
            rows = states.positions.shape[0]
            if input_ids.shape[0] != rows and input_ids.shape[0] % rows == 0:  # beams or several samples per row
                cache.batch_repeat_interleave(input_ids.shape[0] // rows)
        inputs = super().prepare_inputs_for_generation(
            input_ids,
            next_sequence_length=next_sequence_length,
            cache=cache,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            is_first_iteration=is_first_iteration,
            **kwargs,
        )
        # the causal LM's mask over the cached and the new tokens, as generate() widens it at every step: the new
        # tokens' columns only (what the forward reads), so that every decoding step has the same shapes (a compiled
        # step, CUDA graphs)
        mask, ids = inputs.get("attention_mask"), inputs.get("input_ids")
        if not self.config.is_encoder_decoder and isinstance(states, FastformerCache) and states.seen_tokens:
            if mask is not None and ids is not None and mask.shape[-1] == states.seen_tokens + ids.shape[-1]:
                inputs["attention_mask"] = mask[:, states.seen_tokens :]
        return inputs

    def tokens_to_continue(self, states, input_ids, length, attention_mask, kwargs) -> int | None:
        """How many of the `length` input tokens generation continuing from `states` runs: the ones after the
        cached tokens for the whole sequence (a mask as wide as the input, or none), None (all) for new tokens only
        with a mask that covers the cached tokens too (causal LM). Any other form is refused."""
        seq2seq = self.config.is_encoder_decoder
        name = "decoder_input_ids" if seq2seq else "input_ids"
        seen = states.seen_tokens
        if states.holds_beams:
            raise ValueError(
                "This cache comes from beam search: it holds the state of every beam at the last step, not of the "
                "returned sequences. Continue from a cache of greedy search or sampling, or without a cache"
            )
        if seq2seq:
            mask = kwargs.get("decoder_attention_mask")
        else:  # generate() may drop an all-ones mask after making position ids from it
            mask = attention_mask if attention_mask is not None else kwargs.get("position_ids")
        width = length if mask is None else mask.shape[-1]
        if width == length and length > seen:
            return length - seen
        # generate() puts `decoder_start_token_id` before decoder inputs that do not start with it, and widens
        # their mask, so that new tokens alone would continue after a second start token
        prepended = seq2seq and length > 1 and bool((input_ids[:, 0] == self.config.decoder_start_token_id).all())
        if width == seen + length and not prepended:
            return None
        new_tokens = "" if seq2seq else ", or only the new tokens with a mask of the cached and new tokens"
        raise ValueError(
            f"Generation continues from a cache that has read {seen} tokens, but `{name}` has {length} and its "
            f"attention mask {width}: pass the whole sequence so far (the `sequences` generate() returned, then the "
            f"new tokens) with a mask as wide or none{new_tokens}"
        )


class FastformerForConditionalGeneration(CopyHeadSourceMixin, FastformerGenerativeModel):
    """Fastformer encoder + causal Fastformer decoder with cross-attention, for summarization and other
    sequence-to-sequence tasks. One decoding step costs the same at any output length, and the generation
    state (`FastformerCache`) does not grow.

    The encoder is `self.fastformer`, named as in `FastformerModel`, so a seq2seq checkpoint's encoder loads
    into `FastformerModel` and `FastformerForSequenceClassification` (and an encoder checkpoint warm-starts
    this model). Encoder embeddings, decoder embeddings and the LM head share one matrix (the encoder has its own
    with `config.tie_encoder_embeddings=False`). `labels` are the target ids (-100 where ignored);
    `decoder_input_ids` default to them shifted right after
    `decoder_start_token_id`.

    `output_attentions=True` returns, per layer application, `encoder_attentions` as `FastformerModel`'s (B, H, 2, M),
    `decoder_attentions` the causal attention's pooling weights (B, H, 2, T, T) (index 0 alpha, 1 beta; row t weighs
    tokens 1..t) and `cross_attentions` the softmax cross-attention's weights (B, H, T, M) (with
    `attn_implementation="eager"`; "sdpa" gives none, as for BART). The decoder's weights need its whole input in
    one pass: a forward that continues a cache refuses `output_attentions=True`.
    """

    _tied_weights_keys = {
        "decoder.embeddings.word_embeddings.weight": "fastformer.embeddings.word_embeddings.weight",
        "lm_head.weight": "fastformer.embeddings.word_embeddings.weight",
    }
    # with `config.tie_encoder_embeddings=False`: the encoder has word embeddings of its own
    _decoder_tied_weights_keys = {"lm_head.weight": "decoder.embeddings.word_embeddings.weight"}
    _no_split_modules = ["FastformerLayer", "FastformerDecoderLayer"]
    accepts_loss_kwargs = True

    def __init__(self, config: FastformerConfig):
        super().__init__(config.for_encoder_decoder())
        config = self.config
        if not config.tie_encoder_embeddings:
            self._tied_weights_keys = self._decoder_tied_weights_keys
        self.fastformer = FastformerModel(config, add_pooling_layer=False)
        self.decoder = FastformerDecoder(config, cross_attention=True)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.copy_head = FastformerCopyHead(config) if config.copy_mechanism else None
        self.post_init()

    def get_encoder(self, modality=None):
        return self.fastformer

    def get_decoder(self):
        return self.decoder

    def get_input_embeddings(self):
        return self.fastformer.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.fastformer.set_input_embeddings(value)

    @merge_with_config_defaults
    @can_return_tuple
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
        source_ids: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ) -> Seq2SeqLMOutput:
        r"""
        cache: the generation state to continue (`new_cache()`; `past_key_values` and `cache_params` are its
            former names): read whenever given, returned with `use_cache` (off with `labels`, as BART's).
        logits_to_keep: the last `logits_to_keep` positions (0: all) or the positions given, whose logits are
            computed (`transformers.modeling_utils.slice_logits_to_keep`); generate() asks for the last one only.
        source_ids: with `config.copy_mechanism`, the source's token ids (B, M) that the copy head copies:
            `input_ids` by default; needed beside `encoder_outputs` or `inputs_embeds` without `input_ids`
            (generate() passes them at every step).
        token_type_ids, position_ids: the encoder's (`FastformerModel`), read where it runs (no `encoder_outputs`).
        """
        if labels is not None:
            use_cache = False
        cache = self.checked_cache(cache, use_cache)
        if encoder_outputs is None:
            rows = None if position_ids is None else position_ids.shape[0]
            if self.fastformer.packed_sequences(position_ids, attention_mask, rows) is not None:
                raise ValueError(
                    "The source rows are packed (`position_ids` restart without an attention mask), which the "
                    "encoder-decoder does not take apart: pad the sequences to a batch"
                )
            encoder_outputs = self.fastformer(
                input_ids,
                attention_mask=attention_mask,
                token_type_ids=token_type_ids,
                position_ids=position_ids,
                inputs_embeds=inputs_embeds,
                return_dict=True,
                **kwargs,
            )
        elif isinstance(encoder_outputs, (tuple, list)):  # from return_dict=False
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if labels is not None:
            shape = None if decoder_input_ids is None else decoder_input_ids.shape
            labels = checked_token_labels(labels, self.config, shape)
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.shift_labels_right(labels)
        if self.copy_head is not None:
            source_ids = self.checked_source_ids(source_ids if source_ids is not None else input_ids, encoder_outputs)
            self.copy_head.check_decoder_input_ids(decoder_input_ids)
            if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool:
                raise ValueError(
                    "config.copy_mechanism keeps the (batch, position) layout: pass `logits_to_keep` as a count or as "
                    "positions, not as a boolean mask"
                )
        if cache is not None and not isinstance(cache, EncoderDecoderCache):
            raise ValueError(
                "The encoder-decoder continues from an EncoderDecoderCache(FastformerCache(config), DynamicCache()) "
                f"(what `new_cache()` returns), got {type(cache).__name__}"
            )

        decoder_outputs = self.decoder(
            decoder_input_ids,
            attention_mask=decoder_attention_mask,
            position_ids=decoder_position_ids,
            inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            cache=cache,
            return_dict=True,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(decoder_outputs.last_hidden_state, logits_to_keep)
        if decoder_input_ids is not None:
            decoder_input_ids = slice_logits_to_keep(decoder_input_ids[..., None], logits_to_keep)[..., 0]
        logits = self.output_logits(
            hidden_states, encoder_outputs.last_hidden_state, attention_mask, source_ids, decoder_input_ids
        )
        loss = None
        if labels is not None:
            # the labels are aligned with the logits already (no shift): the masked-LM loss is exactly that
            loss = ForMaskedLMLoss(logits, labels, self.config.vocab_size, num_items_in_batch=num_items_in_batch)
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=cache if use_cache else None,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )

    def output_logits(
        self, hidden_states, encoder_hidden_states, encoder_attention_mask=None, source_ids=None, decoder_input_ids=None
    ):
        """The LM head's logits of the decoder's output; with the copy head, log-probabilities that also copy
        `source_ids` (`FastformerCopyHead`; with `config.copy_spans` it reads `decoder_input_ids` at the positions
        of `hidden_states`)."""
        logits = self.lm_head(hidden_states)
        if self.copy_head is None:
            return logits
        return self.copy_head(
            hidden_states, logits, encoder_hidden_states, encoder_attention_mask, source_ids, decoder_input_ids
        )

    def new_cache(self) -> FastformerEncoderDecoderCache:
        """An empty generation cache: the decoder's recurrent state, and the cross-attention's keys and values."""
        return FastformerEncoderDecoderCache(FastformerCache(self.config), DynamicCache())

    def resize_token_embeddings(self, *args, **kwargs):
        """As transformers', for the shared matrix: with the encoder's own (`tie_encoder_embeddings=False`), resizing
        it alone would leave the decoder's and the LM head's as they were, so it is refused."""
        if not self.config.tie_encoder_embeddings:
            raise ValueError(
                "resize_token_embeddings resizes the encoder's word embeddings, which are not the decoder's here "
                "(tie_encoder_embeddings=False): resize before fastformer.summarization.freeze_encoder / "
                "untie_encoder_embeddings"
            )
        return super().resize_token_embeddings(*args, **kwargs)

    def shift_labels_right(self, labels: torch.Tensor) -> torch.Tensor:
        """Decoder inputs for teacher forcing: `decoder_start_token_id`, then the labels without the last one."""
        if self.config.decoder_start_token_id is None or self.config.pad_token_id is None:
            raise ValueError("Set `decoder_start_token_id` and `pad_token_id` in the config to train from `labels`")
        shifted = labels.new_full(labels.shape, self.config.decoder_start_token_id)
        shifted[:, 1:] = labels[:, :-1]
        return shifted.masked_fill(shifted == -100, self.config.pad_token_id)

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor):
        return self.shift_labels_right(labels)


class FastformerForCausalLM(FastformerGenerativeModel):
    """A decoder-only Fastformer language model: the causal layers of `FastformerForConditionalGeneration`
    without cross-attention, generating with the same constant-size state. `labels` are usually the input
    ids; the loss shifts them (position t predicts token t + 1). `output_attentions=True` returns the causal
    attention's pooling weights (B, H, 2, T, T) per layer application, as `FastformerForConditionalGeneration`'s
    `decoder_attentions`."""

    _tied_weights_keys = {"lm_head.weight": "decoder.embeddings.word_embeddings.weight"}
    _no_split_modules = ["FastformerDecoderLayer"]
    accepts_loss_kwargs = True

    def __init__(self, config: FastformerConfig):
        if config.is_encoder_decoder:
            # e.g. a text-generation pipeline on a seq2seq checkpoint: its embeddings are stored under the encoder
            # and would be left random here
            raise ValueError(
                "This config is an encoder-decoder's (is_encoder_decoder=True): load the checkpoint with "
                "FastformerForConditionalGeneration / AutoModelForSeq2SeqLM, not FastformerForCausalLM"
            )
        super().__init__(config)
        self.decoder = FastformerDecoder(config, cross_attention=False)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.post_init()

    def new_cache(self) -> FastformerCache:
        """An empty generation cache (the decoder's recurrent state)."""
        return FastformerCache(self.config)

    def get_input_embeddings(self):
        return self.decoder.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.decoder.embeddings.word_embeddings = value

    @merge_with_config_defaults
    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    @deprecate_kwarg("cache_params", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: FastformerCache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ) -> CausalLMOutputWithPast:
        r"""
        token_type_ids: the token types (segments) (B, T), as the encoder's (`FastformerModel`), of these tokens only
            (generate() passes them so); none given reads as all zeros.
        cache: the generation state to continue (`new_cache()`; `past_key_values` and `cache_params` are its
            former names): read whenever given, returned with `use_cache` (off with `labels`).
        encoder_hidden_states, encoder_attention_mask: GPT-2's with cross-attention; refused, as by GPT-2 without
            it (an encoder-decoder is `FastformerForConditionalGeneration`).
        logits_to_keep: the last `logits_to_keep` positions (0: all) or the positions given, whose logits are
            computed (`transformers.modeling_utils.slice_logits_to_keep`); generate() asks for the last one only.
        """
        if encoder_hidden_states is not None or encoder_attention_mask is not None:
            raise ValueError(
                "FastformerForCausalLM has no cross-attention to read `encoder_hidden_states` with: an "
                "encoder-decoder is FastformerForConditionalGeneration"
            )
        if labels is not None:
            use_cache = False
            labels = checked_token_labels(labels, self.config, None if input_ids is None else input_ids.shape)
        cache = self.checked_cache(cache, use_cache)
        outputs = self.decoder(
            input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            cache=cache,
            return_dict=True,
            **kwargs,
        )
        logits = self.lm_head(slice_logits_to_keep(outputs.last_hidden_state, logits_to_keep))
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits, labels, vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch
            )
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            cache=cache if use_cache else None,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = [
    "FastformerCache",
    "FastformerEncoderDecoderCache",
    "FastformerForCausalLM",
    "FastformerForConditionalGeneration",
    "FastformerForMaskedLM",
    "FastformerForSequenceClassification",
    "FastformerModel",
    "FastformerPreTrainedModel",
]
