"""fastformer.functional against fastformer.naive, the float64 loops written plainly from the paper's Eqs. 3-6."""

import itertools
import math

import pytest
import torch

from fastformer import naive
from fastformer.functional import (
    INTERACTIONS,
    AdditiveAttentionOutput,
    additive_attention,
    additive_pooling,
    causal_additive_attention,
    causal_convolution,
    interact,
    masked_softmax,
    packed_additive_attention,
    pool_interactions,
    pooling_mask,
)

B, H, N, D = 3, 2, 6, 4
# gradcheck perturbs every input entry in turn (two forwards each): a sequence of 5 and heads of 3 keep its cost down
GRADCHECK_SIZE = {"n": 5, "d": 3}


def make_mask(kind, generator, n=N):
    lengths = torch.tensor([n, 4, 1])
    positions = torch.arange(n)
    if kind == "none":
        return None
    if kind == "right":
        return positions < lengths[:, None]
    if kind == "left":
        return positions >= (n - lengths)[:, None]
    if kind == "random":
        mask = torch.rand(B, n, generator=generator) > 0.4
        mask[:, 0] = True
        return mask.long()  # ints are accepted as well as bools
    if kind == "all-padding-row":
        mask = positions < lengths[:, None]
        mask[1] = False
        return mask
    raise AssertionError(kind)


def make_inputs(interaction="product", dtype=torch.float64, seed=0, requires_grad=False, n=N, d=D):
    generator = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(B, H, n, d, generator=generator) for _ in range(3)]
    tensors += [torch.randn(H, d, generator=generator) * 2 for _ in range(2)]
    if interaction == "concat":
        tensors += [torch.randn(H, 2 * d, d, generator=generator) / math.sqrt(d) for _ in range(2)]
    return [t.to(dtype).requires_grad_(requires_grad) for t in tensors], generator


def call(tensors, mask, interaction, **kwargs):
    q, k, v, w_q, w_k, *projections = tensors
    qk_proj, kv_proj = projections or (None, None)
    return additive_attention(
        q,
        k,
        v,
        w_q,
        w_k,
        mask,
        interaction=interaction,
        query_key_projection=qk_proj,
        key_value_projection=kv_proj,
        **kwargs,
    )


MASKS = ["none", "right", "left", "random", "all-padding-row"]


@pytest.mark.parametrize("path", ["fused", "weights", "pooling-mask"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_matches_float64_reference(interaction, mask_kind, path):
    """Every path: the fused poolings (`scaled_dot_product_attention`), the one that returns the weights, and the
    fused one given the mask as a model makes it once per forward (`pooling_mask`)."""
    tensors, generator = make_inputs(interaction)
    mask = make_mask(mask_kind, generator)
    given = pooling_mask(mask, torch.float64) if path == "pooling-mask" and mask is not None else mask
    u = call(tensors, given, interaction, return_weights=path == "weights").output
    q, k, v, w_q, w_k, *projections = tensors
    expected = naive.additive_attention(q, k, v, w_q, w_k, mask, interaction, *projections)
    assert u.shape == v.shape and u.dtype == torch.float64
    torch.testing.assert_close(u, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interaction", INTERACTIONS)
@pytest.mark.parametrize("lengths", [(6,), (2, 3, 1), (1, 1, 4)], ids=lambda lengths: "-".join(map(str, lengths)))
def test_packed_rows_match_the_float64_reference_of_each_sequence(interaction, lengths):
    """Packed rows (several sequences one after the other, `segment_ids` as transformers numbers them): every
    sequence gets the attention it has alone, each row with its own packing."""
    tensors, _ = make_inputs(interaction)
    q, k, v, w_q, w_k, *projections = tensors

    def packing(lengths):
        return torch.cat([torch.full((n,), index) for index, n in enumerate(lengths)])

    segment_ids = torch.stack([packing(lengths), packing(lengths[::-1]), packing(lengths)])  # row 1: another packing
    qk_proj, kv_proj = projections or (None, None)
    u, weights = packed_additive_attention(
        q,
        k,
        v,
        w_q,
        w_k,
        segment_ids,
        interaction=interaction,
        query_key_projection=qk_proj,
        key_value_projection=kv_proj,
        return_weights=True,
    )
    for row in range(B):
        for segment in segment_ids[row].unique():
            mask = (segment_ids[row] == segment).expand(B, -1)  # the sequence alone, the rest padding
            expected = naive.additive_attention(q, k, v, w_q, w_k, mask, interaction, *projections)
            columns = mask[row]
            torch.testing.assert_close(u[row, :, columns], expected[row, :, columns], rtol=1e-12, atol=1e-12)
            sums = weights[row, :, :, columns].sum(dim=-1)  # alpha and beta of each sequence sum to 1
            torch.testing.assert_close(sums, torch.ones_like(sums))


@pytest.mark.parametrize("mask_kind", ["right", "left", "random", "all-padding-row"])
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_gradients_gradcheck(interaction, mask_kind):
    tensors, generator = make_inputs(interaction, requires_grad=True, **GRADCHECK_SIZE)
    mask = make_mask(mask_kind, generator, GRADCHECK_SIZE["n"])
    assert torch.autograd.gradcheck(lambda *t: call(t, mask, interaction).output, tensors)


@pytest.mark.parametrize("mask_kind", ["right", "left", "random"])
def test_gradients_match_reference(mask_kind):
    tensors, generator = make_inputs(requires_grad=True)
    mask = make_mask(mask_kind, generator)
    upstream = torch.randn(B, H, N, D, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((call(tensors, mask, "product").output * upstream).sum(), tensors)
    expected = torch.autograd.grad((naive.additive_attention(*tensors, mask) * upstream).sum(), tensors)
    for grad, reference in zip(grads, expected):
        torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_head_splits_of_projections_match_reference_and_come_back_as_views(interaction):
    """The model passes q, k, v as (B, N, H*D) -> (B, H, N, D) transposed views; u must merge back for free."""
    tensors, generator = make_inputs(interaction)
    mask = make_mask("random", generator)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in tensors[:3]] + tensors[3:]
    assert not views[0].is_contiguous()
    u = call(views, mask, interaction).output
    expected = naive.additive_attention(*tensors[:5], mask, interaction, *tensors[5:])
    torch.testing.assert_close(u, expected, rtol=1e-12, atol=1e-12)
    if interaction != "concat":  # element-wise interactions keep the layout: (B, N, H*D) is a view, not a copy
        assert u.transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("return_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_pool_interactions_equals_pooling_the_formed_interactions(interaction, mask_kind, return_weights):
    tensors, generator = make_inputs(interaction)
    mask = make_mask(mask_kind, generator)
    q, k, _, _, w_k, *projections = tensors
    projection = projections[0] if projections else None
    g = torch.randn(B, H, D, generator=generator, dtype=torch.float64)
    pooled, beta = pool_interactions(g, k, w_k, mask, interaction, projection, return_weights=return_weights)
    expected, expected_beta = additive_pooling(interact(g.unsqueeze(-2), k, interaction, projection), w_k, mask)
    torch.testing.assert_close(pooled, expected, rtol=1e-12, atol=1e-12)
    if return_weights:
        torch.testing.assert_close(beta, expected_beta, rtol=1e-12, atol=1e-12)
    else:
        assert beta is None


def test_additive_pooling_takes_one_weight_per_sequence():
    tensors, generator = make_inputs()
    x, mask = tensors[0], make_mask("random", generator)
    weights = torch.randn(B, H, D, generator=generator, dtype=torch.float64)
    pooled, _ = additive_pooling(x, weights, mask)
    for b in range(B):
        expected, _ = additive_pooling(x[b : b + 1], weights[b], mask[b : b + 1])
        torch.testing.assert_close(pooled[b : b + 1], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_padding_content_never_reaches_real_tokens(interaction):
    tensors, generator = make_inputs(interaction)
    mask = make_mask("random", generator).bool()
    u = call(tensors, mask, interaction).output
    noisy = [t.clone() for t in tensors]
    for t in noisy[:3]:  # q, k, v at padding positions
        t.masked_fill_(~mask[:, None, :, None], 1e6)
    u_noisy = call(noisy, mask, interaction).output
    real = mask[:, None, :, None].expand_as(u)
    torch.testing.assert_close(u_noisy[real], u[real], rtol=0, atol=0)


def test_weights_are_the_two_pooling_distributions():
    tensors, generator = make_inputs()
    mask = make_mask("all-padding-row", generator)
    u, weights = call(tensors, mask, "product", return_weights=True)
    assert weights.shape == (B, H, 2, N)
    without = call(tensors, mask, "product")
    assert isinstance(without, AdditiveAttentionOutput) and without.weights is None
    torch.testing.assert_close(u, without.output)
    padding = ~mask[:, None, None, :].expand_as(weights)
    assert torch.all(weights[padding] == 0)
    sums = weights.sum(-1)  # (B, H, 2): 1 for sequences with tokens, 0 for the all-padding row
    torch.testing.assert_close(sums[[0, 2]], torch.ones_like(sums[[0, 2]]))
    assert torch.all(sums[1] == 0)
    # alpha is the softmax of w_q . q_i / sqrt(D) over the real tokens of sequence 0
    q, _, _, w_q, _ = tensors
    expected_alpha = ((q[0] @ w_q[:, :, None]).squeeze(-1) / math.sqrt(D)).softmax(-1)
    torch.testing.assert_close(weights[0, :, 0], expected_alpha)


def test_all_padding_rows_are_finite_with_and_without_grad():
    tensors, _ = make_inputs(dtype=torch.float32, requires_grad=True)
    mask = torch.zeros(B, N, dtype=torch.bool)
    u = call(tensors, mask, "product").output
    u.sum().backward()
    assert torch.isfinite(u).all()
    assert all(torch.isfinite(t.grad).all() for t in tensors)


@pytest.mark.parametrize("return_weights", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_half_precision_inputs_softmax_in_float32(dtype, return_weights):
    tensors, generator = make_inputs(dtype=torch.float32)
    mask = make_mask("left", generator)
    half = [t.to(dtype) for t in tensors]
    u, weights = call(half, mask, "product", return_weights=return_weights)
    assert u.dtype == dtype and (weights is None if not return_weights else weights.dtype == torch.float32)
    expected = naive.additive_attention(*half, mask)
    error = (u.double() - expected).norm() / expected.norm()
    assert error < 2e-2, f"relative error {error:.2e}"


def test_extreme_logits_stay_finite():
    tensors, generator = make_inputs(dtype=torch.float32)
    tensors[0] = tensors[0] * 1e4  # w_q . q_i / sqrt(D) reaches about +-1e4
    mask = make_mask("random", generator)
    u, weights = call(tensors, mask, "product", return_weights=True)
    assert torch.isfinite(u).all() and torch.isfinite(weights).all()


def test_masked_softmax_matches_softmax_over_real_tokens():
    logits = torch.randn(2, 5, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 1, 0], [0, 0, 0, 0, 0]])
    probs = masked_softmax(logits, mask)
    torch.testing.assert_close(probs[0, [0, 1, 3]], logits[0, [0, 1, 3]].softmax(-1))
    assert torch.all(probs[0, [2, 4]] == 0) and torch.all(probs[1] == 0)


def test_unknown_interaction_names_the_allowed_values():
    x = torch.randn(1, 1, 2, 4)
    with pytest.raises(ValueError, match="product.*add.*concat.*'dot'"):
        interact(x[:, :, 0], x, "dot")
    with pytest.raises(ValueError, match="projection"):
        interact(x[:, :, 0], x, "concat")


# ---- causal additive attention ------------------------------------------------------------------------------


def leaves(state):
    """The tensors of a CausalAttentionState: (log_normalizer, pooled) of each pooling."""
    return [t for pooling in state for t in pooling]


def call_causal(tensors, mask, interaction="product", state=None, chunk_size=64, return_weights=False):
    """(u, state), or with `return_weights` (u, state, weights)."""
    q, k, v, w_q, w_k, *projections = tensors
    qk_proj, kv_proj = projections or (None, None)
    output = causal_additive_attention(
        q,
        k,
        v,
        w_q,
        w_k,
        mask,
        state,
        interaction=interaction,
        query_key_projection=qk_proj,
        key_value_projection=kv_proj,
        chunk_size=chunk_size,
        return_weights=return_weights,
    )
    return output if return_weights else output[:2]


@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_causal_weights_match_float64_reference(interaction, mask_kind):
    tensors, generator = make_inputs(interaction)
    mask = make_mask(mask_kind, generator)
    q, k, _, w_q, w_k, *projections = tensors
    _, _, weights = call_causal(tensors, mask, interaction, return_weights=True)
    torch.testing.assert_close(weights[:, :, 0], naive.causal_pooling_weights(q, w_q, mask), rtol=1e-12, atol=1e-12)
    # beta pools p_t = interact(global query_t, k_t), whose global queries are alpha's pools
    global_query = weights[:, :, 0].to(q.dtype) @ q
    p = torch.empty_like(q)
    for b, h, t in itertools.product(range(B), range(H), range(N)):
        projection = projections[0][h] if projections else None
        p[b, h, t] = naive.combine(interaction, global_query[b, h, t], k[b, h, t], projection)
    torch.testing.assert_close(weights[:, :, 1], naive.causal_pooling_weights(p, w_k, mask), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="return_weights=True needs the whole sequence"):
        call_causal(tensors, mask, interaction, state=call_causal(tensors, mask, interaction)[1], return_weights=True)


@pytest.mark.parametrize("chunk_size", [1, 4, 64], ids=lambda c: f"C{c}")
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_causal_matches_float64_reference(interaction, mask_kind, chunk_size):
    tensors, generator = make_inputs(interaction)
    mask = make_mask(mask_kind, generator)
    u, _ = call_causal(tensors, mask, interaction, chunk_size=chunk_size)
    expected = naive.causal_additive_attention(*tensors[:5], mask, interaction, *tensors[5:])
    torch.testing.assert_close(u, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mask_kind", ["left", "random", "all-padding-row"])
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_causal_gradients_gradcheck(interaction, mask_kind):
    """Chunks of 2 tokens: the scan within each chunk, the carry across chunks and a padded last chunk. One chunk
    runs the same operations (the forward matches the reference at every chunk size above)."""
    tensors, generator = make_inputs(interaction, requires_grad=True, **GRADCHECK_SIZE)
    mask = make_mask(mask_kind, generator, GRADCHECK_SIZE["n"])
    assert torch.autograd.gradcheck(lambda *t: call_causal(t, mask, interaction, chunk_size=2)[0], tensors)


def test_causal_gradients_match_reference():
    tensors, generator = make_inputs(requires_grad=True)
    mask = make_mask("left", generator)
    upstream = torch.randn(B, H, N, D, generator=generator, dtype=torch.float64)
    grads = torch.autograd.grad((call_causal(tensors, mask, chunk_size=4)[0] * upstream).sum(), tensors)
    expected = torch.autograd.grad((naive.causal_additive_attention(*tensors, mask) * upstream).sum(), tensors)
    for grad, reference in zip(grads, expected):
        torch.testing.assert_close(grad, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("splits", [(1, 5), (3, 3), (5, 1), (2, 1, 3)], ids=lambda s: "+".join(map(str, s)))
@pytest.mark.parametrize("interaction", INTERACTIONS)
def test_causal_in_pieces_with_state_equals_whole(interaction, splits):
    tensors, generator = make_inputs(interaction)
    mask = make_mask("left", generator)
    whole, final_state = call_causal(tensors, mask, interaction)
    pieces, state, start = [], None, 0
    for length in splits:
        piece = [t[:, :, start : start + length] if t.dim() == 4 and t.shape[2] == N else t for t in tensors]
        u, state = call_causal(piece, mask[:, start : start + length], interaction, state, chunk_size=2)
        pieces.append(u)
        start += length
    torch.testing.assert_close(torch.cat(pieces, dim=2), whole, rtol=1e-12, atol=1e-12)
    for got, expected in zip(leaves(state), leaves(final_state)):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def test_causal_state_size_does_not_grow():
    tensors, _ = make_inputs()
    _, state = call_causal(tensors, None)
    sizes = [t.numel() for t in leaves(state)]
    assert sizes == [B * H, B * H * D] * 2


def test_causal_never_looks_ahead():
    tensors, _ = make_inputs()
    u, _ = call_causal(tensors, None, chunk_size=4)
    changed = [t.clone() for t in tensors]
    for t in changed[:3]:
        t[:, :, 3:] = torch.randn_like(t[:, :, 3:]) * 100
    u_changed, _ = call_causal(changed, None, chunk_size=4)
    assert torch.equal(u_changed[:, :, :3], u[:, :, :3])
    assert not torch.allclose(u_changed[:, :, 3:], u[:, :, 3:])


@pytest.mark.parametrize("scale", [1e4, -1e4], ids=["+1e4", "-1e4"])
def test_causal_extreme_logits_stay_finite_and_correct(scale):
    tensors, generator = make_inputs(dtype=torch.float32)
    mask = make_mask("random", generator)
    tensors[0] = tensors[0] * scale  # logits w_q . q_i / sqrt(D) of about +-1e4
    u, state = call_causal(tensors, mask, chunk_size=4)
    assert torch.isfinite(u).all()
    assert all(torch.isfinite(t).all() for t in leaves(state))
    expected = naive.causal_additive_attention(*tensors, mask)
    error = (u.double() - expected).norm() / expected.norm()
    assert error < 1e-5, f"relative error {error:.2e}"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_causal_half_precision(dtype):
    tensors, generator = make_inputs(dtype=torch.float32)
    mask = make_mask("left", generator)
    half = [t.to(dtype) for t in tensors]
    u, state = call_causal(half, mask, chunk_size=4)
    assert u.dtype == dtype and state.query.pooled.dtype == torch.float32
    steps, state = [], None  # token by token, as in decoding: the state stays float32, the weights are half
    for t in range(N):
        step, state = call_causal([x[:, :, t : t + 1] for x in half[:3]] + half[3:], mask[:, t : t + 1], state=state)
        steps.append(step)
    assert steps[0].dtype == dtype and state.query.pooled.dtype == torch.float32
    expected = naive.causal_additive_attention(*half, mask)
    for result in (u, torch.cat(steps, dim=2)):
        error = (result.double() - expected).norm() / expected.norm()
        assert error < 2e-2, f"relative error {error:.2e}"


def test_causal_all_padding_row_is_finite_with_grad():
    tensors, _ = make_inputs(dtype=torch.float32, requires_grad=True)
    u, _ = call_causal(tensors, torch.zeros(B, N, dtype=torch.bool))
    u.sum().backward()
    assert torch.isfinite(u).all() and all(torch.isfinite(t.grad).all() for t in tensors)


def test_causal_token_by_token_stays_accurate_over_long_float32_decoding():
    """Decoding updates the state once per token (a log-sum-exp and a lerp): after 2,000 float32 updates it still
    gives the chunked computation over the whole sequence."""
    generator = torch.Generator().manual_seed(0)
    length = 2000
    tensors = [torch.randn(1, H, length, D, generator=generator) for _ in range(3)]
    tensors += [torch.randn(H, D, generator=generator) * 2 for _ in range(2)]
    whole, final = call_causal(tensors, None)
    state, steps = None, []
    for t in range(length):
        u, state = call_causal([x[:, :, t : t + 1] for x in tensors[:3]] + tensors[3:], None, state=state)
        steps.append(u)
    torch.testing.assert_close(torch.cat(steps, dim=2), whole, rtol=1e-4, atol=1e-5)
    for got, expected in zip(leaves(state), leaves(final)):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", [2, 4])
@pytest.mark.parametrize("mask_kind", ["none", "left", "right", "holes", "all-padding-row"])
def test_causal_convolution_matches_the_float64_loop_and_continues_from_its_state(mask_kind, kernel):
    """`causal_convolution` against `naive.causal_convolution`; padding reads as zero (a left-padded row gets what its
    tokens have alone); in pieces, each from the state the last one left, it equals one pass; a zero weight is the
    identity; the loss reaches the weight."""
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(3, 7, 6, generator=generator, dtype=torch.float64)
    weight = torch.randn(6, 1, kernel, generator=generator, dtype=torch.float64)
    mask = None if mask_kind == "none" else torch.ones(3, 7, dtype=torch.bool)
    if mask_kind == "left":
        mask[1, :3] = False
    elif mask_kind == "right":
        mask[1, 4:] = False
    elif mask_kind == "holes":  # a chunk left-padded after tokens, as a chat turn's new tokens
        mask[1, 2:4] = mask[2, 1] = False
    elif mask_kind == "all-padding-row":
        mask[2] = False
    out, state = causal_convolution(x, weight, mask)
    assert state.shape == (3, 6, kernel - 1)
    torch.testing.assert_close(out, naive.causal_convolution(x, weight, mask), rtol=1e-12, atol=1e-12)
    if mask_kind in ("left", "holes"):  # a row's tokens get what they have alone, wherever its padding is
        tokens = mask[1]
        alone = causal_convolution(x[1:2, tokens], weight)[0][0]
        torch.testing.assert_close(out[1, tokens], alone, rtol=1e-12, atol=1e-12)
    pieces, carried = [], None
    for start, stop in ((0, 1), (1, 4), (4, 5), (5, 7)):
        piece, carried = causal_convolution(
            x[:, start:stop], weight, None if mask is None else mask[:, start:stop], carried
        )
        pieces.append(piece)
    torch.testing.assert_close(torch.cat(pieces, dim=1), out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(carried, state, rtol=0, atol=0)
    torch.testing.assert_close(causal_convolution(x, torch.zeros_like(weight), mask)[0], x, rtol=0, atol=0)
    gradient = torch.autograd.grad(causal_convolution(x, weight.requires_grad_(), mask)[0].sum(), weight)[0]
    assert gradient.abs().sum() > 0
