"""The paper's math as pure functions of tensors: Wu et al., "Fastformer: Additive Attention Can Be All You Need"
(arXiv:2108.09084), Eqs. 3-6, and the copy head's. Shapes: B batch, H heads, N tokens, D head size."""

import math
from typing import NamedTuple

import torch
from torch.nn import functional as nn_functional

INTERACTIONS = ("product", "add", "concat")


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype softmaxes and pooled states are computed in: torch.promote_types(dtype, torch.float32)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def masked_softmax(logits: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis in float32 (float64 for float64 logits) that gives padding (`attention_mask`
    False/0, broadcastable to logits) exactly zero weight; a row without tokens gets zeros, not NaN."""
    logits = logits.to(accumulation_dtype(logits.dtype))
    if attention_mask is None:
        return logits.softmax(dim=-1)
    attention_mask = attention_mask.to(torch.bool)
    # finfo.min rather than -inf: an all-padding row stays finite, and the mask below zeroes it
    logits = logits.masked_fill(~attention_mask, torch.finfo(logits.dtype).min)
    return logits.softmax(dim=-1) * attention_mask


class PoolingMask(NamedTuple):
    """An attention mask in the form the poolings take it, made once for all of a forward's layers (`pooling_mask`)."""

    bias: torch.Tensor  # (B, 1, 1, N) additive, `scaled_dot_product_attention`'s: 0 for a token, the lowest for padding
    has_tokens: torch.Tensor  # (B, 1, 1): 1 for a row with a token, 0 for a row of padding only
    tokens: torch.Tensor  # (B, N) bool: True for a token (for the paths that return the weights)


def pooling_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> PoolingMask:
    """The `PoolingMask` of an attention mask (B, N) (non-zero for tokens) in the poolings' compute `dtype`."""
    tokens = attention_mask.to(torch.bool)
    mask = tokens.to(dtype)
    bias = (mask - 1) * torch.finfo(dtype).max  # exactly 0 for a token, the dtype's lowest value for padding
    return PoolingMask(bias[:, None, None, :], mask.amax(dim=-1)[:, None, None], tokens)


def as_pooling_mask(attention_mask, dtype) -> PoolingMask | None:
    """`attention_mask` as a `PoolingMask` in `dtype` (None for None; a `PoolingMask` as it is)."""
    if attention_mask is None or isinstance(attention_mask, PoolingMask):
        return attention_mask
    return pooling_mask(attention_mask, dtype)


def _as_bool_mask(attention_mask) -> torch.Tensor | None:
    """(B, N) True for tokens, from a (B, N) mask or a `PoolingMask`."""
    return attention_mask.tokens if isinstance(attention_mask, PoolingMask) else attention_mask


def attention_pooling(
    x: torch.Tensor, vectors: torch.Tensor, mask: PoolingMask | None = None, scale: float | None = None
) -> torch.Tensor:
    """sum_i softmax_i(v . x_i * scale) x_i per head, as `scaled_dot_product_attention` with the learned vector v as
    the query: x (B, H, N, E), vectors (H, E) or (B, H, E), scale 1 / sqrt(E) by default -> (B, H, E). A row of
    padding only pools its padding (finite; callers zero it with `mask.has_tokens`)."""
    query = vectors.unsqueeze(-2).expand(*x.shape[:2], 1, vectors.shape[-1])  # a view: one query per (B, H)
    bias = None if mask is None else mask.bias
    return nn_functional.scaled_dot_product_attention(query, x, x, attn_mask=bias, scale=scale).squeeze(-2)


def additive_pooling(
    x: torch.Tensor, weight: torch.Tensor, attention_mask=None, *, return_weights: bool = True
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One additive-attention pooling: softmax_i(w . x_i / sqrt(D)) weighted sum of x_i (Eqs. 3-4 and 5-6).

    x: (B, H, N, D); weight: (H, D) or (B, H, D), the learned w; attention_mask: (B, N) or a `PoolingMask`. Returns
    the pooled vector (B, H, D) in x's dtype (zeros for a row without tokens) and the weights (B, H, N) in float32 or
    better (None without `return_weights`). The products run on x as (B, N, H*D), a free view of a head split.
    """
    if not return_weights:
        mask = as_pooling_mask(attention_mask, x.dtype)
        pooled = attention_pooling(x, weight, mask)
        return (pooled if mask is None else pooled * mask.has_tokens), None
    attention_mask = _as_bool_mask(attention_mask)
    batch, heads, length, dim = x.shape
    tokens = x.transpose(1, 2).reshape(batch, length, heads * dim)  # (B, N, H*D), a view for a head split
    logits = (tokens @ _block_diagonal(weight)).transpose(1, 2)  # (B, H, N): w_h . x_{i,h}
    probs = _pooling_weights(logits, dim, attention_mask)
    # sum_i probs_{h,i} x_{i,h,d} for every head pair (h, h'), then the pairs h == h': (B, H*D, H) -> (B, H, D)
    every_pair = tokens.transpose(1, 2) @ probs.to(x.dtype).transpose(1, 2)
    pooled = every_pair.view(batch, heads, dim, heads).diagonal(dim1=1, dim2=3).transpose(1, 2)
    return pooled, probs


def pool_projections(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    vectors: torch.Tensor,
    attention_mask=None,
    *,
    return_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`additive_pooling` of the heads of the projections y_i = W x_i + b, without forming the y_i.

    x: (B, N, C); weight: (H*D, C) and bias: (H*D,), a Linear layer's; vectors: (H, D) or (B, H, D), the w. Per head h,
    with W_h the head's D rows of W:
        w_h . y_{i,h} = (W_h^T w_h) . x_i + w_h . b_h,     sum_i a_i y_{i,h} = W_h (sum_i a_i x_i) + b_h sum_i a_i
    so two (N x C) by (C x H) products replace the (N x C) by (C x H*D) projection. Returns as `additive_pooling`.
    """
    heads, dim = vectors.shape[-2:]
    per_head = weight.view(heads, dim, -1)  # (H, D, C)
    effective = torch.einsum("...hd,hdc->...hc", vectors, per_head)  # (H, C) or (B, H, C): W_h^T w_h
    attention_mask = _as_bool_mask(attention_mask)
    shift = (vectors * bias.view(heads, dim)).sum(dim=-1)[..., None]  # (H, 1) or (B, H, 1): w_h . b_h
    logits = effective @ x.transpose(1, 2) + shift  # (B, H, N)
    probs = _pooling_weights(logits, dim, attention_mask)
    weights = probs.to(x.dtype)
    pooled_x = weights @ x  # (B, H, C)
    pooled = torch.einsum("bhc,hdc->bhd", pooled_x, per_head) + bias.view(heads, dim) * weights.sum(-1, keepdim=True)
    return pooled, probs if return_weights else None


def _pooling_weights(logits: torch.Tensor, dim: int, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """softmax_i(logit_i / sqrt(dim)) of logits (B, H, N) in float32 or better, padding (mask (B, N) == 0) excluded."""
    logits = logits.to(accumulation_dtype(logits.dtype)) / math.sqrt(dim)
    return masked_softmax(logits, None if attention_mask is None else attention_mask[:, None, :])


def _block_diagonal(weight: torch.Tensor) -> torch.Tensor:
    """(..., H, D) per-head vectors -> (..., H*D, H), column h holding head h's vector in rows h*D..(h+1)*D."""
    heads, dim = weight.shape[-2:]
    eye = torch.eye(heads, dtype=weight.dtype, device=weight.device)
    return (weight.unsqueeze(-1) * eye.unsqueeze(-2)).reshape(*weight.shape[:-2], heads * dim, heads)


def pool_interactions(
    global_vector: torch.Tensor,
    tokens: torch.Tensor,
    weight: torch.Tensor,
    attention_mask=None,
    interaction: str = "product",
    projection: torch.Tensor | None = None,
    *,
    return_weights: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`additive_pooling(interact(g, tokens), weight, mask)` without forming the (B, H, N, D) interactions.

    global_vector: (B, H, D); tokens: (B, H, N, D); weight: (H, D). With p_i = interact(g, x_i) and
    beta = softmax_i(w . p_i / sqrt(D)), every interaction is linear in x_i, so
        "product": w . (g * x_i) = (w * g) . x_i,           sum_i beta_i p_i = g * sum_i beta_i x_i
        "add":     w . (g + x_i) = w . x_i + const,         sum_i beta_i p_i = g sum_i beta_i + sum_i beta_i x_i
        "concat":  w . (g P1 + x_i P2) = (P2 w) . x_i + const, sum_i beta_i p_i = (g P1) sum_i beta_i
                                                                                 + (sum_i beta_i x_i) P2
    (a shift leaves a softmax unchanged; sum_i beta_i is 1, or 0 for a padding-only row). Returns as `additive_pooling`.
    """
    _check_interaction(interaction, projection)
    if not return_weights:
        attention_mask = as_pooling_mask(attention_mask, tokens.dtype)
    if interaction == "product":
        pooled, beta = additive_pooling(tokens, weight * global_vector, attention_mask, return_weights=return_weights)
        return global_vector * pooled, beta
    if interaction == "add":
        pooled, beta = additive_pooling(tokens, weight, attention_mask, return_weights=return_weights)
        return global_vector * _weight_sum(beta, attention_mask, tokens.dtype) + pooled, beta
    dim = tokens.shape[-1]  # concat
    own, other = projection[:, :dim], projection[:, dim:]  # P1 for g, P2 for the tokens
    pooled, beta = additive_pooling(
        tokens, (other @ weight.unsqueeze(-1)).squeeze(-1), attention_mask, return_weights=return_weights
    )
    pooled = (pooled.unsqueeze(-2) @ other).squeeze(-2)  # (B, H, D)
    own_part = (global_vector.unsqueeze(-2) @ own).squeeze(-2)
    return own_part * _weight_sum(beta, attention_mask, tokens.dtype) + pooled, beta


def _weight_sum(weights, mask, dtype):
    """sum_i of a pooling's weights, (B, H, 1): 1, or 0 for a row of padding only."""
    if weights is not None:
        return weights.sum(dim=-1, keepdim=True).to(dtype)
    return 1.0 if mask is None else mask.has_tokens


def _check_interaction(interaction: str, projection: torch.Tensor | None):
    if interaction not in INTERACTIONS:
        raise ValueError(f"interaction must be one of {INTERACTIONS}, got {interaction!r}")
    if interaction == "concat" and projection is None:
        raise ValueError('interaction="concat" needs a projection of shape (heads, 2 * head_dim, head_dim)')


def interact(
    global_vector: torch.Tensor,
    tokens: torch.Tensor,
    interaction: str = "product",
    projection: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine a global vector (B, H, 1, D), or one per token (B, H, N, D), with every token (B, H, N, D) (RQ2):
    "product" g * x_i (the paper's, Eq. 5), "add" g + x_i, or "concat" [g ; x_i] P with a learned P (H, 2D, D)."""
    _check_interaction(interaction, projection)
    g = global_vector
    if interaction == "product":
        return g * tokens
    if interaction == "add":
        return g + tokens
    head_dim = tokens.shape[-1]  # concat
    # g may be a decoding step's pooled state, in float32 at least: a matmul takes one dtype
    return tokens @ projection[:, head_dim:] + g.to(projection.dtype) @ projection[:, :head_dim]


class AdditiveAttentionOutput(NamedTuple):
    """What `additive_attention` returns."""

    output: torch.Tensor  # u: (B, H, N, D)
    weights: torch.Tensor | None  # (B, H, 2, N): alpha (index 0) and beta (index 1); None unless asked for


def additive_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    interaction: str = "product",
    query_key_projection: torch.Tensor | None = None,
    key_value_projection: torch.Tensor | None = None,
    return_weights: bool = False,
) -> AdditiveAttentionOutput:
    """Fastformer additive attention, Eqs. 3-6, before the output transform W_r and the query residual.

    query, key, value: (B, H, N, D); query_weight, key_weight: (H, D), w_q and w_k; attention_mask: (B, N), 1 for
    tokens, or its `PoolingMask`. Padding takes no part in either pooling; a row of padding only pools to zeros.

        alpha = softmax(w_q . q_i / sqrt(D)),  global query q = sum_i alpha_i q_i
        p_i   = q * k_i
        beta  = softmax(w_k . p_i / sqrt(D)),  global key   k = sum_i beta_i p_i   (pools p_i, not k_i)
        u_i   = k * v_i

    `interaction` swaps both "*" for another combination (`interact`). Returns `AdditiveAttentionOutput`: u
    (B, H, N, D) and, with `return_weights`, alpha and beta as (B, H, 2, N). The p_i are never formed. For head splits
    of (B, N, H*D) projections, "product" and "add" give u as one too: `u.transpose(1, 2).reshape(B, N, H*D)` is free.
    """
    if not return_weights:  # one mask for both poolings
        attention_mask = as_pooling_mask(attention_mask, query.dtype)
    if not return_weights and interaction == "product":  # the default, in the fewest operators
        global_query = attention_pooling(query, query_weight, attention_mask)
        if attention_mask is not None:
            global_query = global_query * attention_mask.has_tokens  # 0 for a row without tokens: so is its key
        global_key = global_query * attention_pooling(key, key_weight * global_query, attention_mask)
        return AdditiveAttentionOutput(value * global_key.unsqueeze(-2), None)  # value first: u takes its layout
    global_query, alpha = additive_pooling(query, query_weight, attention_mask, return_weights=return_weights)
    global_key, beta = pool_interactions(
        global_query, key, key_weight, attention_mask, interaction, query_key_projection, return_weights=return_weights
    )
    u = interact(global_key.unsqueeze(-2), value, interaction, key_value_projection)  # (B, H, N, D)
    return AdditiveAttentionOutput(u, torch.stack((alpha, beta), dim=-2) if return_weights else None)


def segment_pooling(
    x: torch.Tensor, weight: torch.Tensor, segment_ids: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`additive_pooling` of every sequence of packed rows on its own: each token gets its sequence's pooled vector.

    x: (B, H, N, D); weight: (H, D); segment_ids: (B, N), each token's sequence, from 0 in each row (transformers'
    `find_packed_sequence_indices`). Returns (B, H, N, D) in x's dtype and the weights (B, H, N) in float32 or better.
    """
    dim = x.shape[-1]
    logits = (x @ weight.unsqueeze(-1)).squeeze(-1)  # (B, H, N): w_h . x_{i,h}
    logits = logits.to(accumulation_dtype(logits.dtype)) / math.sqrt(dim)
    index = segment_ids[:, None, :].expand(logits.shape)  # (B, H, N): slot of each token's sequence
    maxima = torch.full_like(logits, float("-inf")).scatter_reduce(-1, index, logits, "amax")
    exp = (logits - maxima.gather(-1, index)).exp()
    probs = exp / torch.zeros_like(exp).scatter_add(-1, index, exp).gather(-1, index)
    vector_index = index[..., None].expand(x.shape)
    pooled = torch.zeros_like(x).scatter_add(2, vector_index, probs.to(x.dtype)[..., None] * x)  # (B, H, S, D)
    return pooled.gather(2, vector_index), probs


def packed_additive_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    segment_ids: torch.Tensor,
    *,
    interaction: str = "product",
    query_key_projection: torch.Tensor | None = None,
    key_value_projection: torch.Tensor | None = None,
    return_weights: bool = False,
) -> AdditiveAttentionOutput:
    """`additive_attention` of packed rows (segment_ids (B, N) as `segment_pooling`'s), each sequence on its own."""
    global_query, alpha = segment_pooling(query, query_weight, segment_ids)  # (B, H, N, D): its sequence's q
    interactions = interact(global_query, key, interaction, query_key_projection)  # p_i
    global_key, beta = segment_pooling(interactions, key_weight, segment_ids)
    u = interact(global_key, value, interaction, key_value_projection)
    return AdditiveAttentionOutput(u, torch.stack((alpha, beta), dim=-2) if return_weights else None)


class PackedRows(NamedTuple):
    """Where each token of packed rows (B, N) sits in the batch of their sequences, one a row, padded on the right."""

    sequence: torch.Tensor  # (B, N): the row of the token's sequence in that batch
    position: torch.Tensor  # (B, N): the token's position in its sequence
    shape: tuple[int, int]  # that batch's (sequences, longest sequence)
    mask: torch.Tensor  # that batch's attention mask, (sequences, longest sequence): True for a token


def packed_rows(segment_ids: torch.Tensor) -> PackedRows:
    """The `PackedRows` of `segment_ids` (B, N); reads two numbers on the host (how many sequences, the longest)."""
    batch, length = segment_ids.shape
    counts = segment_ids[:, -1] + 1  # (B,) sequences per row
    sequence = segment_ids + (counts.cumsum(0) - counts)[:, None]  # numbered over the whole batch
    index = torch.arange(length, device=segment_ids.device).expand(batch, length)
    start = torch.full_like(sequence.flatten(), length).scatter_reduce(0, sequence.flatten(), index.flatten(), "amin")
    position = index - start[sequence]
    shape = (int(counts.sum()), int(position.max()) + 1)
    mask = torch.zeros(shape, dtype=torch.bool, device=segment_ids.device)
    mask[sequence, position] = True
    return PackedRows(sequence, position, shape, mask)


def unpack(x: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """(B, H, N, D) of packed rows -> (S, H, L, D), a sequence a row, zeros after its end."""
    tokens = x.transpose(1, 2)  # (B, N, H, D)
    rows = tokens.new_zeros(*packed.shape, *tokens.shape[2:])  # (S, L, H, D)
    rows[packed.sequence, packed.position] = tokens
    return rows.transpose(1, 2)


def repack(rows: torch.Tensor, packed: PackedRows) -> torch.Tensor:
    """The inverse of `unpack`: (S, H, L, D) -> (B, H, N, D)."""
    return rows.transpose(1, 2)[packed.sequence, packed.position].transpose(1, 2)


class PoolingState(NamedTuple):
    """A streaming softmax pooling so far, per (batch, head), in float32 or better."""

    log_normalizer: torch.Tensor  # (B, H) log sum_i exp(logit_i) over the tokens so far; finfo.min before any
    pooled: torch.Tensor  # (B, H, D) sum_i softmax_i x_i over the tokens so far; zeros before any


def initial_pooling_state(batch: int, heads: int, dim: int, dtype=torch.float32, device=None) -> PoolingState:
    """The pooling before any token: a log normalizer at `dtype`'s lowest, a zero pooled vector."""
    lowest = torch.finfo(dtype).min
    return PoolingState(
        torch.full((batch, heads), lowest, dtype=dtype, device=device),
        torch.zeros(batch, heads, dim, dtype=dtype, device=device),
    )


class CausalAttentionState(NamedTuple):
    """What `causal_additive_attention` needs to continue a sequence: one state per pooling, of a fixed size."""

    query: PoolingState
    key: PoolingState


class CausalAttentionOutput(NamedTuple):
    """What `causal_additive_attention` returns."""

    output: torch.Tensor  # u: (B, H, N, D)
    state: CausalAttentionState  # after the last token
    weights: torch.Tensor | None  # (B, H, 2, N, N): alpha (index 0) and beta (index 1); None unless asked for


def causal_pooling_weights(
    x: torch.Tensor, weight: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The weights of `causal_additive_pooling`, (B, H, N, N) in float32 or better: row t holds
    softmax_{i<=t}(w . x_i / sqrt(D)) over the real tokens i <= t, zeros elsewhere (quadratic: for inspection)."""
    length, dim = x.shape[-2:]
    logits = (x @ weight.unsqueeze(-1)).squeeze(-1) / math.sqrt(dim)  # (B, H, N)
    visible = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()  # (N, N): token i <= position t
    if attention_mask is not None:  # bool or int, non-zero for tokens; or float and additive, 0 for tokens
        tokens = attention_mask == 0 if attention_mask.is_floating_point() else attention_mask.to(torch.bool)
        visible = visible & tokens[:, None, None, :]  # (B, 1, N, N)
    return masked_softmax(logits.unsqueeze(-2).expand(*logits.shape[:2], length, length), visible)


def causal_additive_pooling(
    x: torch.Tensor,
    weight: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    state: PoolingState | None = None,
    chunk_size: int = 64,
) -> tuple[torch.Tensor, PoolingState]:
    """Prefix additive pooling: for every t, sum_{i<=t} softmax_{i<=t}(w . x_i / sqrt(D)) x_i.

    x: (B, H, N, D); weight: (H, D); attention_mask: (B, N), bool or int, or additive as `causal_mask` makes it;
    `state` continues an earlier call. Returns the pooled vectors (B, H, N, D) in x's dtype (zeros before any token;
    for a decoding step in the state's dtype) and the state after the last position (new tensors).

    A two-level scan: within chunks of `chunk_size` tokens a masked (C x C) matrix of exp(logit_i - running max_t)
    weights, across chunks the same on the chunk summaries. Every exponent is <= 0; the maxima carry no gradient.
    """
    batch, heads, length, dim = x.shape
    if state is None:
        state = initial_pooling_state(batch, heads, dim, accumulation_dtype(x.dtype), x.device)
    if length == 1:  # one decoding step: update the streaming softmax directly
        return _pooling_step(x, weight, attention_mask, state)
    acc = state.pooled.dtype
    lowest = torch.finfo(acc).min
    # a head split copied once: the matmuls below would each copy it to merge its (B, H) batch dimensions
    x = x.contiguous()

    # the state as a softmax at the shift m = its log normalizer: sum exp(logit_i - m) = 1 (a phantom 1 before any
    # token, weighing nothing as soon as a token comes, exp(finfo.min - logit) = 0), sum exp(logit_i - m) x_i = pooled
    state_max, state_sum = state.log_normalizer, state.pooled
    logits = _scaled_logits((x @ weight.unsqueeze(-1)).squeeze(-1), dim, attention_mask, acc)  # (B, H, N)

    # one chunk up to chunk_size tokens (one compile guard for those lengths), else chunks of chunk_size, the last
    # padded. No F.pad of nothing: a dynamic-length graph takes its clone as contiguous, and a view of it then fails
    chunk, chunks = (length, 1) if length <= chunk_size else (chunk_size, -(-length // chunk_size))
    padded = chunks * chunk - length
    # x stays in its dtype: the products with it take the weights (in [0, 1]) in x's dtype, and add up in `acc` after
    s, xs = logits, x
    if padded:
        s = torch.nn.functional.pad(s, (0, padded), value=float("-inf"))
        xs = torch.nn.functional.pad(xs, (0, 0, 0, padded))
    s, xs = s.view(batch, heads, chunks, chunk), xs.view(batch, heads, chunks, chunk, dim)

    with torch.no_grad():  # the running maxima: shifts that cancel in the softmax
        within = s.cummax(dim=-1).values.clamp(min=lowest)  # (B, H, C#, C) max over the chunk so far
        chunk_max = within[..., -1]  # (B, H, C#)
        # max over everything before each chunk: the state's and the earlier chunks'
        before = torch.cat([state_max[..., None], chunk_max[..., :-1]], dim=-1).cummax(dim=-1).values
        running = torch.maximum(within, before[..., None])  # (B, H, C#, C) max over all tokens <= t

    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    # inside a chunk: weight of token i at position t
    exponent = (s[..., None, :] - running[..., :, None]).masked_fill(~causal, float("-inf"))
    weights = exponent.exp()  # (B, H, C#, C, C)
    numerator = weights.to(xs.dtype) @ xs  # (B, H, C#, C, D)
    denominator = weights.sum(dim=-1)  # (B, H, C#, C)

    # across chunks: each chunk summarised at its own max, then pooled into the chunks after it
    summary = (s - chunk_max[..., None]).exp()  # (B, H, C#, C)
    summary_sum = (summary.unsqueeze(-2).to(xs.dtype) @ xs).squeeze(-2).to(acc)  # (B, H, C#, D)
    earlier = torch.ones(chunks, chunks, dtype=torch.bool, device=x.device).tril(diagonal=-1)
    carry_weights = (chunk_max[..., None, :] - before[..., :, None]).masked_fill(~earlier, float("-inf")).exp()
    from_state = (state_max[..., None] - before).exp()  # (B, H, C#)
    carry_denominator = (carry_weights @ summary.sum(-1, keepdim=True)).squeeze(-1) + from_state
    carry_sum = carry_weights @ summary_sum + from_state[..., None] * state_sum[..., None, :]

    rescale = (before[..., None] - running).exp()  # (B, H, C#, C)
    numerator = numerator + rescale[..., None] * carry_sum[..., None, :]
    denominator = denominator + rescale * carry_denominator[..., None]
    # before the first token (of a sequence without a state) both are 0: divide by 1 (a clamp: NaN gradients)
    has_tokens = denominator > 0
    pooled = numerator / torch.where(has_tokens, denominator, 1.0)[..., None]  # (B, H, C#, C, D)

    # after the last position: contiguous copies, as `_pooling_step` keeps them (one layout for a compiled step)
    seen = has_tokens[..., -1, -1]
    log_normalizer = running[..., -1, -1] + torch.where(seen, denominator[..., -1, -1], 1.0).log()
    new_state = PoolingState(log_normalizer.masked_fill(~seen, lowest), pooled[..., -1, -1, :].clone())
    return pooled.view(batch, heads, -1, dim)[:, :, :length].to(x.dtype), new_state


def causal_mask(attention_mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An attention mask (B, N) as the causal poolings add it to their logits: 0 for a token, -inf for padding."""
    return attention_mask.to(torch.bool).to(dtype).log()


def _scaled_logits(logits, dim, attention_mask, dtype):
    """logits (B, H, N) / sqrt(dim) in `dtype`, -inf for padding (attention_mask (B, N), maybe additive)."""
    if attention_mask is not None and attention_mask.is_floating_point():
        return torch.add(attention_mask[:, None, :].to(dtype), logits, alpha=dim**-0.5)
    logits = logits.to(dtype) / math.sqrt(dim)
    if attention_mask is None:
        return logits
    return logits.masked_fill(~attention_mask.to(torch.bool)[:, None, :], float("-inf"))


def _step_logits(token, weight, attention_mask, dtype):
    """w . x / sqrt(D) of one token per (batch, head), in `dtype`, -inf for padding: token (B, H, D), weight (H, D),
    attention_mask (B, 1) or None. In `dtype` already with an additive mask: one `baddbmm` over the heads."""
    scale = token.shape[-1] ** -0.5
    if token.dtype == weight.dtype == dtype and (attention_mask is None or attention_mask.dtype == dtype):
        per_head, weight = token.transpose(0, 1), weight.unsqueeze(-1)  # (H, B, D), (H, D, 1)
        if attention_mask is None:  # beta=0: the input is not read, a view of the right shape stands in
            return torch.baddbmm(weight[:, :1], per_head, weight, beta=0, alpha=scale).squeeze(-1).T
        return torch.baddbmm(attention_mask.T.unsqueeze(-1), per_head, weight, alpha=scale).squeeze(-1).T
    return _scaled_logits((token * weight).sum(dim=-1, keepdim=True), token.shape[-1], attention_mask, dtype)[..., 0]


def _pooling_step(x, weight, attention_mask, state):
    """`causal_additive_pooling` of one token x (B, H, 1, D): a lerp towards it by its softmax share so far."""
    token = x[:, :, 0]  # (B, H, D)
    logit = _step_logits(token, weight, attention_mask, state.pooled.dtype)  # (B, H)
    log_normalizer = torch.logaddexp(state.log_normalizer, logit)
    share = (logit - log_normalizer).exp().unsqueeze(-1)  # in [0, 1]; 0 for padding (logit -inf)
    if token.dtype == state.pooled.dtype:
        pooled = torch.lerp(state.pooled, token, share)
    else:
        pooled = torch.addcmul(state.pooled, share, token - state.pooled)
    return pooled.unsqueeze(2), PoolingState(log_normalizer, pooled)


def causal_additive_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    query_weight: torch.Tensor,
    key_weight: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    state: CausalAttentionState | None = None,
    *,
    interaction: str = "product",
    query_key_projection: torch.Tensor | None = None,
    key_value_projection: torch.Tensor | None = None,
    chunk_size: int = 64,
    return_weights: bool = False,
) -> CausalAttentionOutput:
    """Causal Fastformer attention: the paper's Eqs. 3-6 over prefixes, so position t sees tokens 1..t only.

    Shapes as `additive_attention`. At position t:
        global query_t = sum_{i<=t} softmax_{i<=t}(w_q . q_i / sqrt(D)) q_i
        p_t            = global query_t * k_t
        global key_t   = sum_{i<=t} softmax_{i<=t}(w_k . p_i / sqrt(D)) p_i
        u_t            = global key_t * v_t
    Padding (0 in attention_mask, or -inf in a `causal_mask`) takes no part. `state`, from an earlier call,
    continues a sequence; one token with a state costs O(D) per head. Returns `CausalAttentionOutput`: u, the state
    after the last token and, with `return_weights` (no `state`), alpha and beta as (B, H, 2, N, N).
    """
    if return_weights and state is not None:
        raise ValueError("return_weights=True needs the whole sequence: a `state` does not keep the tokens before it")
    query_state, key_state = state if state is not None else (None, None)
    global_query, query_state = causal_additive_pooling(query, query_weight, attention_mask, query_state, chunk_size)
    p = interact(global_query, key, interaction, query_key_projection)  # (B, H, N, D)
    global_key, key_state = causal_additive_pooling(p, key_weight, attention_mask, key_state, chunk_size)
    # a decoding step pools in the state's dtype: one cast back, at the end
    u = interact(global_key, value, interaction, key_value_projection).to(value.dtype)
    weights = None
    if return_weights:
        alpha = causal_pooling_weights(query, query_weight, attention_mask)
        weights = torch.stack((alpha, causal_pooling_weights(p, key_weight, attention_mask)), dim=2)
    return CausalAttentionOutput(u, CausalAttentionState(query_state, key_state), weights)


def causal_convolution(
    x: torch.Tensor, weight: torch.Tensor, attention_mask: torch.Tensor | None = None, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token plus a depthwise convolution of it and the K - 1 tokens before it (`config.decoder_conv_kernel`):
        out_t = x_t + sum_{j=0..K-1} weight[:, 0, K - 1 - j] * r_j(t)
    where r_0(t), r_1(t), ... are the real tokens at or before t, latest first.

    x: (B, T, D); weight: (D, 1, K), a depthwise `nn.Conv1d`'s; attention_mask: (B, T), non-zero for tokens; state:
    (B, D, K - 1), the last K - 1 tokens before x (None: zeros). Returns out (B, T, D) (padding keeps its input) and
    the state after x."""
    columns = x.transpose(1, 2)  # (B, D, T)
    width = weight.shape[-1] - 1
    if state is None:
        history = nn_functional.pad(columns, (width, 0))
    else:
        history = torch.cat((state.to(columns.dtype), columns), dim=-1)
    kernel = weight.to(x.dtype)
    if attention_mask is None:
        mixed = nn_functional.conv1d(history, kernel, groups=x.shape[-1])  # (B, D, T)
        return x + mixed.transpose(1, 2), history[..., -width:]
    # the tokens moved to the end in order, padding before them as zeros (a stable sort of the mask), convolved there
    real = nn_functional.pad(attention_mask.to(torch.bool), (width, 0), value=True)  # the state's columns count
    order = torch.argsort(real.to(torch.uint8), dim=-1, stable=True)
    packed = (history * real[:, None]).gather(-1, order[:, None].expand_as(history))
    mixed = nn_functional.conv1d(nn_functional.pad(packed, (width, 0)), kernel, groups=x.shape[-1])
    # each token reads the output at its packed column; padding reads none
    column = real.cumsum(dim=-1)[:, width:] - real.sum(dim=-1, keepdim=True) + real.shape[-1] - 1
    mixed = mixed.gather(-1, column.clamp(min=0)[:, None].expand(-1, x.shape[-1], -1))
    return torch.addcmul(x, mixed.transpose(1, 2), attention_mask[..., None].to(x.dtype)), packed[..., -width:]


def copy_attention(
    query: torch.Tensor, source: torch.Tensor, source_mask: torch.Tensor | None = None, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One head of scaled dot-product attention of decoder tokens over source tokens, to copy them (See et al., 2017).

    query: (B, T, D); source: (B, M, D), the encoder's output; source_mask: (B, M), True/1 for tokens; bias: added to
    the scores, broadcastable to (B, T, M). Returns the weights a (B, T, M) in float32 at least, padding exactly 0,
    and the context sum_j a_tj source_j (B, T, D) in the source's dtype. An all-padding source attends to all of it."""
    # scaled before the product, normalized in float32 at least: half-precision scores overflow
    scores = torch.matmul(query * query.shape[-1] ** -0.5, source.transpose(-1, -2))
    scores = scores.to(accumulation_dtype(scores.dtype))
    if bias is not None:
        scores = scores + bias
    if source_mask is not None:
        mask = source_mask.to(torch.bool)
        mask = mask | ~mask.any(dim=-1, keepdim=True)
        scores = scores.masked_fill(~mask[:, None, :], torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return weights, torch.matmul(weights.to(source.dtype), source)


def span_continuations(source_ids: torch.Tensor, input_ids: torch.Tensor) -> torch.Tensor:
    """Where a copy would continue a span of the source: (B, T, M), True at source position j > 0 for decoder
    position t where the source token before j is the decoder's input token t. source_ids: (B, M); input_ids: (B, T)."""
    occurrences = source_ids[:, None, :] == input_ids[:, :, None]
    # shifted by a roll, not a slice: an (M - 1)-long tensor would make an exported graph assume M - 1 != 1
    not_first = torch.arange(source_ids.shape[1], device=source_ids.device) > 0
    return occurrences.roll(1, dims=-1) & not_first


def source_context(source: torch.Tensor, weight: torch.Tensor, source_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Every source state plus a depthwise convolution of the window of states centred on it:
        out_j = source_j + sum_{o=-r..r} weight[:, 0, r + o] * source_{j+o}      (window W = 2r + 1)
    (`config.copy_context_window`). source: (B, M, D); weight: (D, 1, W), a depthwise `nn.Conv1d`'s; source_mask:
    (B, M), True/1 for tokens. Padding and the window's reach past either end count as zero states."""
    if source_mask is not None:
        source = source * source_mask[..., None].to(source.dtype)
    mixed = nn_functional.conv1d(
        source.transpose(1, 2), weight.to(source.dtype), padding=weight.shape[-1] // 2, groups=source.shape[-1]
    )
    return source + mixed.transpose(1, 2)


def pointer_generator(
    logits: torch.Tensor, copy_weights: torch.Tensor, source_ids: torch.Tensor, gate_logits: torch.Tensor
) -> torch.Tensor:
    """The pointer-generator's output distribution (See et al., 2017, Eq. 9), as log-probabilities:
        P(w) = p_gen softmax(logits)_w + (1 - p_gen) sum_{j: source_ids_j = w} copy_weights_j,  p_gen = sigmoid(gate)

    logits: (B, T, V); copy_weights: (B, T, M), `copy_attention`'s; source_ids: (B, M); gate_logits: (B, T). Returns
    log P (B, T, V) in float32 (float64 for float64 logits); a word of probability 0 gets a finite log."""
    dtype = accumulation_dtype(logits.dtype)
    gate_logits = gate_logits.to(dtype).unsqueeze(-1)
    generated = torch.log_softmax(logits.to(dtype), dim=-1) + nn_functional.logsigmoid(gate_logits)
    index = source_ids[:, None, :].expand(-1, copy_weights.shape[1], -1)
    copied = torch.zeros_like(generated).scatter_add(-1, index, copy_weights.to(dtype))
    copied = torch.log(copied.clamp_min(torch.finfo(dtype).tiny)) + nn_functional.logsigmoid(-gate_logits)
    return torch.logaddexp(generated, copied)
