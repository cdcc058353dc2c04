"""The paper's math as pure functions of tensors.

Wu et al., "Fastformer: Additive Attention Can Be All You Need" (arXiv:2108.09084), Eqs. 3-6.
No config, no modules, no Hugging Face objects: the layers in `modeling_fastformer.py` map a config to
these functions, and the tests compare them with a plain float64 loop written from the equations.

Shapes: B batch, H heads, N tokens, D head size.
"""

import math

import torch

INTERACTIONS = ("product", "add", "concat")


def masked_softmax(logits: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last axis (tokens) that gives padding exactly zero weight.

    logits: (..., N), any float dtype; computed in float32, or float64 when the logits are float64.
    attention_mask: broadcastable to logits, True/1 for tokens and False/0 for padding.
    A row with no token at all gets all-zero weights (so it pools to zeros) instead of NaN.
    """
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if attention_mask is None:
        return logits.softmax(dim=-1)
    attention_mask = attention_mask.to(torch.bool)
    # finfo.min rather than -inf: an all-padding row stays finite, and the mask below zeroes it
    logits = logits.masked_fill(~attention_mask, torch.finfo(logits.dtype).min)
    return logits.softmax(dim=-1) * attention_mask


def additive_pooling(
    x: torch.Tensor, weight: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One additive-attention pooling: softmax_i(w . x_i / sqrt(D)) weighted sum of x_i (Eqs. 3-4 and 5-6).

    x: (B, H, N, D); weight: (H, D), the learned vector w; attention_mask: (B, N).
    Returns the pooled vector (B, H, D) in x's dtype and the weights (B, H, N) in float32 or better.
    """
    logits = (x @ weight.unsqueeze(-1)).squeeze(-1)  # (B, H, N)
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / math.sqrt(x.shape[-1])
    mask = None if attention_mask is None else attention_mask[:, None, :]  # (B, 1, N)
    probs = masked_softmax(logits, mask)  # (B, H, N)
    pooled = (probs.to(x.dtype).unsqueeze(-2) @ x).squeeze(-2)  # (B, H, D)
    return pooled, probs


def interact(
    global_vector: torch.Tensor,
    tokens: torch.Tensor,
    interaction: str = "product",
    projection: torch.Tensor | None = None,
) -> torch.Tensor:
    """Combine a global vector with every token (the paper's RQ2 variants).

    global_vector: (B, H, D); tokens: (B, H, N, D).
    - "product": g * x_i, the paper's choice (Eq. 5 and the u_i step);
    - "add":     g + x_i;
    - "concat":  [g ; x_i] P with P: (H, 2D, D) a learned projection, computed as g P[:D] + x_i P[D:].
    Returns (B, H, N, D).
    """
    g = global_vector.unsqueeze(-2)  # (B, H, 1, D)
    if interaction == "product":
        return g * tokens
    if interaction == "add":
        return g + tokens
    if interaction == "concat":
        if projection is None:
            raise ValueError('interaction="concat" needs a projection of shape (heads, 2 * head_dim, head_dim)')
        head_dim = tokens.shape[-1]
        return tokens @ projection[:, head_dim:] + g @ projection[:, :head_dim]
    raise ValueError(f"interaction must be one of {INTERACTIONS}, got {interaction!r}")


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
):
    """Fastformer additive attention, Eqs. 3-6, before the output transform W_r and the query residual.

    query, key, value: (B, H, N, D); query_weight, key_weight: (H, D), the learned vectors w_q and w_k;
    attention_mask: (B, N), 1 for tokens and 0 for padding (bool or int). Padding takes no part in
    either pooling; an all-padding row gives finite values.

        alpha = softmax(w_q . q_i / sqrt(D)),  global query q = sum_i alpha_i q_i
        p_i   = q * k_i
        beta  = softmax(w_k . p_i / sqrt(D)),  global key   k = sum_i beta_i p_i   (pools p_i, not k_i)
        u_i   = k * v_i

    `interaction` swaps both "*" for another combination (see `interact`); "concat" takes one projection
    per interaction. Returns u: (B, H, N, D); with `return_weights`, also the two pooling distributions
    stacked as (B, H, 2, N): index 0 is alpha (global query), index 1 is beta (global key).
    """
    global_query, alpha = additive_pooling(query, query_weight, attention_mask)
    p = interact(global_query, key, interaction, query_key_projection)  # (B, H, N, D)
    global_key, beta = additive_pooling(p, key_weight, attention_mask)
    u = interact(global_key, value, interaction, key_value_projection)  # (B, H, N, D)
    if return_weights:
        return u, torch.stack((alpha, beta), dim=-2)
    return u
