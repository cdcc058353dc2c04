"""The paper's equations (Eqs. 3-6) and the copy head's as float64 loops, one sequence, head and token at a time: the
slow reference that `fastformer.functional` is checked against, with the same arguments and shapes."""

import math

import torch


def combine(interaction: str, global_vector: torch.Tensor, token: torch.Tensor, projection=None) -> torch.Tensor:
    """The interaction of a global vector with one token (D,), as the paper writes it (RQ2)."""
    if interaction == "product":
        return global_vector * token
    if interaction == "add":
        return global_vector + token
    if interaction == "concat":
        return torch.cat([global_vector, token]) @ projection.double()  # [g ; x] P
    raise ValueError(f"interaction must be one of ('product', 'add', 'concat'), got {interaction!r}")


def _pool(vectors, weight, real, dim):
    """sum over the real tokens i of softmax_i(w . x_i / sqrt(D)) x_i; the zero vector when there is none."""
    if not real:
        return torch.zeros(dim, dtype=torch.float64)
    weights = torch.stack([weight @ vectors[i] / math.sqrt(dim) for i in real]).softmax(0)
    return sum(w * vectors[i] for w, i in zip(weights, real))


def additive_attention(
    query,
    key,
    value,
    query_weight,
    key_weight,
    attention_mask=None,
    interaction="product",
    query_key_projection=None,
    key_value_projection=None,
    *,
    causal=False,
) -> torch.Tensor:
    """u (B, H, N, D) of Eqs. 3-6, padding left out (a sequence without tokens pools to zeros); with `causal`, position
    t pools its prefix 1..t only."""
    q, k, v, w_q, w_k = (t.double() for t in (query, key, value, query_weight, key_weight))
    batch, heads, length, dim = q.shape
    mask = torch.ones(batch, length, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    qk_proj, kv_proj = ([None] * heads if p is None else p for p in (query_key_projection, key_value_projection))
    u = torch.zeros(batch, heads, length, dim, dtype=torch.float64)
    for b in range(batch):
        seen = [[i for i in range(t + 1 if causal else length) if mask[b, i]] for t in range(length)]
        for h in range(heads):
            p = [
                combine(interaction, _pool(q[b, h], w_q[h], real, dim), k[b, h, t], qk_proj[h])
                for t, real in enumerate(seen)
            ]
            for t, real in enumerate(seen):
                u[b, h, t] = combine(interaction, _pool(p, w_k[h], real, dim), v[b, h, t], kv_proj[h])
    return u


def causal_additive_attention(*args, **kwargs) -> torch.Tensor:
    """u (B, H, N, D) of the causal variant, `additive_attention(*args, **kwargs, causal=True)`."""
    return additive_attention(*args, **kwargs, causal=True)


def causal_pooling_weights(x, weight, attention_mask=None) -> torch.Tensor:
    """(B, H, N, N): row t holds softmax_{i<=t}(w . x_i / sqrt(D)) over the real tokens i <= t, zeros elsewhere."""
    x, weight = x.double(), weight.double()
    batch, heads, length, dim = x.shape
    mask = torch.ones(batch, length, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    weights = torch.zeros(batch, heads, length, length, dtype=torch.float64)
    for b in range(batch):
        for h in range(heads):
            for t in range(length):
                real = [i for i in range(t + 1) if mask[b, i]]
                if real:
                    logits = torch.stack([weight[h] @ x[b, h, i] / math.sqrt(dim) for i in real])
                    weights[b, h, t, real] = logits.softmax(0)
    return weights


def pointer_generator(
    logits, query, source, source_mask, source_ids, gate_logits, input_ids=None, span_gate=None
) -> torch.Tensor:
    """log P (B, T, V) of See et al.'s pointer-generator (2017, Eq. 9): a_j = softmax over the real source tokens j
    (all if none is real) of (query_t . source_j / sqrt(D)), p = sigmoid(gate_t), and
    P(w) = p softmax(logits_t)_w + (1 - p) sum of a_j over the real j with source_ids_j = w. With `input_ids` and
    `span_gate` (B, T), the score of each j > 0 whose previous source token is input token t gains span_gate_t."""
    logits, query, source, gate_logits = (t.double() for t in (logits, query, source, gate_logits))
    batch, steps, vocab = logits.shape
    length, dim = source.shape[1:]
    mask = torch.ones(batch, length, dtype=torch.bool) if source_mask is None else source_mask.bool()
    log_p = torch.zeros(batch, steps, vocab, dtype=torch.float64)
    for b in range(batch):
        real = [j for j in range(length) if mask[b, j]] or list(range(length))
        for t in range(steps):
            scores = torch.stack([query[b, t] @ source[b, j] / math.sqrt(dim) for j in real])
            if span_gate is not None:
                continues = [j > 0 and source_ids[b, j - 1] == input_ids[b, t] for j in real]
                scores = scores + span_gate[b, t].double() * torch.tensor(continues, dtype=torch.float64)
            attention = scores.softmax(0)
            p = 1 / (1 + math.exp(-gate_logits[b, t].item()))
            distribution = p * logits[b, t].softmax(0)
            for weight, j in zip(attention, real):
                distribution[source_ids[b, j]] += (1 - p) * weight
            log_p[b, t] = distribution.log()
    return log_p


def source_context(source, weight, source_mask=None) -> torch.Tensor:
    """(B, M, D): source_j plus, for every offset o of the odd window W = weight.shape[-1] (weight (D, 1, W)),
    weight[:, 0, W // 2 + o] * source_{j+o} where j + o is a real source token (`functional.source_context`)."""
    source, weight = source.double(), weight.double()
    batch, length, _ = source.shape
    mask = torch.ones(batch, length, dtype=torch.bool) if source_mask is None else source_mask.bool()
    reach = weight.shape[-1] // 2
    out = torch.zeros_like(source)
    for b in range(batch):
        for j in range(length):
            out[b, j] = source[b, j] if mask[b, j] else 0
            for o in range(-reach, reach + 1):
                if 0 <= j + o < length and mask[b, j + o]:
                    out[b, j] += weight[:, 0, reach + o] * source[b, j + o]
    return out


def causal_convolution(x, weight, attention_mask=None) -> torch.Tensor:
    """(B, T, D): x_t plus, for a token t and j in 0..K-1, weight[:, 0, K - 1 - j] * the j-th latest token at or
    before t (padding is skipped, and keeps its input)."""
    x, weight = x.double(), weight.double()
    batch, length, _ = x.shape
    mask = torch.ones(batch, length, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    kernel = weight.shape[-1]
    out = x.clone()
    for b in range(batch):
        for t in (t for t in range(length) if mask[b, t]):
            tokens = [i for i in range(t + 1) if mask[b, i]]
            for j, i in enumerate(reversed(tokens[-kernel:])):
                out[b, t] += weight[:, 0, kernel - 1 - j] * x[b, i]
    return out
