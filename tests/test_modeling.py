"""Fastformer models: padding invariance, the config switches, and the PreTrainedModel API."""

import copy
import functools
import inspect

import pytest
import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    Trainer,
    TrainingArguments,
)
from transformers.modeling_outputs import MaskedLMOutput, SequenceClassifierOutput

from fastformer import (
    FastformerConfig,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from fastformer.functional import additive_attention
from fastformer.modeling_fastformer import FastformerCausalAttention, FastformerLayer, FastformerTokenTypeEmbeddings

HEADS = [FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM]
VOCAB, HIDDEN, NUM_HEADS, INTERMEDIATE, LAYERS = 99, 32, 4, 37, 3
HEAD_DIM = HIDDEN // NUM_HEADS


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(
        tiny_config,
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        num_hidden_layers=LAYERS,
        num_attention_heads=NUM_HEADS,
        intermediate_size=INTERMEDIATE,
    )


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def split_outputs(output):
    """(per-token tensor, per-sequence tensor) of a model's output, None where it has none."""
    if isinstance(output, SequenceClassifierOutput):
        return None, output.logits
    if isinstance(output, MaskedLMOutput):
        return output.logits, None
    return output.last_hidden_state, output.pooler_output


VARIANTS = {
    "paper-default": {},
    "unshared-concat-cls": dict(share_query_value=False, share_layers=False, interaction="concat", pooler_type="cls"),
    "heads-shared-add-mean": dict(share_heads=True, interaction="add", pooler_type="mean"),
    "cls-attention": dict(share_query_value=False, share_layers=False, pooler_type="cls_tanh", cls_attention_heads=2),
}


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_padding_never_changes_real_tokens(build, model_class, variant, side):
    model = build(model_class, **VARIANTS[variant])
    generator = torch.Generator().manual_seed(1)
    # width 20 >= HIDDEN / 2: the batch takes the collapsed path, the 5- and 2-token sequences alone the plain one
    lengths, width = [5, 17, 2], 20
    sequences = [torch.randint(1, VOCAB, (n,), generator=generator) for n in lengths]
    ids = torch.zeros(len(lengths), width, dtype=torch.long)  # pad_token_id = 0
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if side == "left" else slice(0, len(seq))
        ids[row, span], mask[row, span] = seq, 1
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        for row, seq in enumerate(sequences):
            alone = model(seq[None])
            per_token, per_sequence = split_outputs(alone)
            batched_token, batched_sequence = split_outputs(batched)
            if per_token is not None:
                real = mask[row].bool()
                torch.testing.assert_close(batched_token[row, real], per_token[0], rtol=1e-5, atol=1e-5)
            if per_sequence is not None:
                torch.testing.assert_close(batched_sequence[row], per_sequence[0], rtol=1e-5, atol=1e-5)


COLLAPSIBLE = {
    "paper-default": {},
    "unshared": dict(share_query_value=False, share_layers=False),
    "heads-shared": dict(share_heads=True),
    "no-query-residual": dict(share_query_value=False, share_layers=False, query_residual=False),
}


@pytest.mark.parametrize("output_attentions", [True, False], ids=["weights", "fused"])
@pytest.mark.parametrize("variant", COLLAPSIBLE)
def test_collapsed_attention_equals_the_plain_path_in_float64(tiny_config, variant, output_attentions):
    """collapsed_attention folds W_q, W_v, W_r and the output dense into one matrix: the same function, values,
    pooling weights and gradients, for every mask (an all-padding row included), whether the poolings return their
    weights or are fused (`scaled_dot_product_attention`), beside the plain path that returns the weights."""
    torch.manual_seed(0)
    layer = FastformerLayer(tiny_config(**COLLAPSIBLE[variant])).double()
    for parameter in layer.parameters():  # larger than the initializer's, so that every term matters
        torch.nn.init.normal_(parameter, std=0.3)
    x = torch.randn(4, 24, HIDDEN, dtype=torch.float64)
    mask = torch.ones(4, 24, dtype=torch.bool)
    mask[1, 15:] = False  # right padding
    mask[2, :10] = False  # left padding
    mask[3] = False  # no token at all
    attention, dense = layer.attention, layer.attention_output.dense

    reference, reference_weights = attention(x, mask, output_attentions=True)
    reference = dense(reference)
    plain, plain_weights = attention(x, mask, output_attentions=output_attentions)
    plain = dense(plain)
    collapsed, collapsed_weights = layer.collapsed_attention(x, mask, output_attentions)
    for path, weights in ((plain, plain_weights), (collapsed, collapsed_weights)):
        torch.testing.assert_close(path, reference, rtol=1e-12, atol=1e-12)
        if output_attentions:
            torch.testing.assert_close(weights, reference_weights, rtol=1e-12, atol=1e-12)
        else:
            assert weights is None

    upstream = torch.randn_like(plain)
    parameters = list(layer.parameters())
    reference_grads = torch.autograd.grad((reference * upstream).sum(), parameters, allow_unused=True)
    for path in (plain, collapsed):
        grads = torch.autograd.grad((path * upstream).sum(), parameters, allow_unused=True)
        for (name, _), expected, grad in zip(layer.named_parameters(), reference_grads, grads):
            if expected is None:  # the feed-forward block, not part of either
                assert grad is None, name
            else:
                torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("share_query_value", [False, True], ids=["own-value", "query-as-value"])
def test_cls_attention_is_the_first_real_tokens_softmax_attention_in_float64(tiny_config, share_query_value):
    """`cls=True` (the last layer's, with `cls_attention_heads`) gives the first real token multi-head softmax
    attention over the real tokens through the layer's query, key, value and output, written out here; every other
    row is the additive sub-layer's, on the plain and the collapsed path; a row of padding only stays finite."""
    torch.manual_seed(0)
    heads = 2
    layer = FastformerLayer(tiny_config(share_query_value=share_query_value, cls_attention_heads=heads)).double()
    for parameter in layer.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    x = torch.randn(4, 24, HIDDEN, dtype=torch.float64)
    mask = torch.ones(4, 24, dtype=torch.bool)
    mask[1, 15:] = False  # right padding
    mask[2, :10] = False  # left padding: its first token is the 11th
    mask[3] = False
    attention, output = layer.attention, layer.attention_output
    value = attention.query if share_query_value else attention.value
    first = torch.tensor([0, 0, 10, 0])
    for mode in ("plain", "collapsed"):
        layer.attention_mode = mode
        additive, _ = layer.attention_sublayer(x, mask)
        found, _ = layer.attention_sublayer(x, mask, cls=True)
        assert torch.isfinite(found).all()
        for row in range(3):
            real, cls = x[row, mask[row]], x[row, first[row]]
            query = attention.query(cls).view(heads, 1, -1)
            keys, values = (
                linear(real).view(len(real), heads, -1).transpose(0, 1) for linear in (attention.key, value)
            )
            weights = (query @ keys.transpose(1, 2) / (HIDDEN // heads) ** 0.5).softmax(-1)  # (heads, 1, tokens)
            expected = output.layer_norm(cls + output.dense((weights @ values).reshape(-1)))
            torch.testing.assert_close(found[row, first[row]], expected, rtol=1e-12, atol=1e-12)
        others = torch.ones_like(mask)
        others[torch.arange(4), first] = False
        torch.testing.assert_close(found[others], additive[others], rtol=0, atol=0)


@pytest.mark.parametrize("share_layers", [False, True], ids=["unshared", "one-layer"])
def test_cls_attention_adds_no_weights_and_changes_only_the_first_tokens_output(build, share_layers):
    """The same weights with and without `cls_attention_heads`: only the first real token's output differs (its
    softmax attention comes in the last layer application only, after which each token's feed-forward is its own)."""
    additive = build(FastformerModel, share_layers=share_layers, share_query_value=False)
    model = build(FastformerModel, share_layers=share_layers, share_query_value=False, cls_attention_heads=2)
    assert model.state_dict().keys() == additive.state_dict().keys()
    model.load_state_dict(additive.state_dict())
    ids = torch.randint(1, VOCAB, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    with torch.no_grad():
        found, expected = (m(ids, attention_mask=mask).last_hidden_state for m in (model, additive))
    first = torch.zeros_like(mask, dtype=torch.bool)
    first[0, 0] = first[1, 3] = True
    assert not torch.isclose(found[first], expected[first]).all(-1).any()
    torch.testing.assert_close(found[~first], expected[~first], rtol=0, atol=0)
    with pytest.raises(ValueError, match="`cls_attention_heads` needs a row per sequence, but the rows are packed"):
        model(ids[:1], position_ids=torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4]]))


@pytest.mark.parametrize("model_class", [FastformerModel, FastformerForConditionalGeneration])
def test_feed_forward_in_chunks_gives_the_whole_batchs_result(build, model_class):
    """The feed-forward blocks run on `chunk_size_feed_forward` tokens at a time (a chunk may straddle two rows, the
    last is shorter), with and without gradients: the same outputs and gradients in float64, padding included."""
    model = build(model_class, share_layers=False, chunk_size_feed_forward=0).double()
    ids = torch.randint(5, VOCAB, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    mask[2] = 0
    inputs = dict(input_ids=ids, attention_mask=mask)
    if model_class is FastformerForConditionalGeneration:
        inputs["decoder_input_ids"] = ids[:, :6]

    def output():
        result = model(**inputs)
        return result.last_hidden_state if model_class is FastformerModel else result.logits

    with torch.no_grad():
        whole = output()
    feed_forward = (
        model.get_encoder().layers[0].feed_forward
        if model_class is not FastformerModel
        else model.layers[0].feed_forward
    )
    calls = []
    run = feed_forward.chunk_forward
    feed_forward.chunk_forward = lambda states: calls.append(states.shape) or run(states)
    model.config.chunk_size_feed_forward = 4
    with torch.no_grad():
        torch.testing.assert_close(output(), whole, rtol=1e-12, atol=1e-12)
    assert calls == [(4, HIDDEN)] * 8 + [(1, HIDDEN)]  # 33 tokens in chunks of 4
    model.config.chunk_size_feed_forward = 0
    output().sum().backward()

    def gradients():  # the pooler's, which the hidden states do not reach, are None
        return {name: parameter.grad for name, parameter in model.named_parameters() if parameter.grad is not None}

    whole_gradients = gradients()
    model.zero_grad(set_to_none=True)
    model.config.chunk_size_feed_forward = 4
    calls.clear()
    output().sum().backward()  # with gradients: the same chunks
    assert calls == [(4, HIDDEN)] * 8 + [(1, HIDDEN)]
    chunked_gradients = gradients()
    assert chunked_gradients.keys() == whole_gradients.keys()
    for name, gradient in chunked_gradients.items():
        torch.testing.assert_close(gradient, whole_gradients[name], rtol=1e-10, atol=1e-12, msg=name)


@pytest.mark.parametrize("query_residual", [True, False])
def test_query_residual_adds_the_query_or_nothing(tiny_config, query_residual):
    """config.query_residual: the attention output is W_r u_i + q_i (the paper's) or W_r u_i alone."""
    torch.manual_seed(0)
    attention = FastformerLayer(tiny_config(query_residual=query_residual, share_query_value=False)).attention
    for vector in (attention.query_weight, attention.key_weight):  # torch.empty until a model initializes them
        torch.nn.init.normal_(vector)
    x = torch.randn(2, 7, HIDDEN)
    query, q, k, v = attention._project(x)
    (w_q, w_k), _ = attention._attention_arguments()
    u, _ = additive_attention(q, k, v, w_q, w_k)
    expected = attention.transform(u.transpose(1, 2).reshape(x.shape))
    if query_residual:
        expected = expected + attention.query(x)
    torch.testing.assert_close(attention(x)[0], expected)


def test_auto_takes_the_collapsed_path_for_long_product_inputs_in_large_batches_only(tiny_config):
    """Sequences of hidden_size / 2 tokens or more (hidden_size with gradients), batches of 16 tokens per hidden
    unit or more."""
    layer = FastformerLayer(tiny_config())
    assert layer.attention_mode == "auto"
    many = FastformerLayer.collapse_min_tokens_per_unit * HIDDEN
    with torch.no_grad():
        assert layer.uses_collapsed_attention(torch.zeros(many // (HIDDEN // 2), HIDDEN // 2, HIDDEN))
        assert layer.uses_collapsed_attention(torch.zeros(1, many, HIDDEN))
        assert not layer.uses_collapsed_attention(torch.zeros(1, many - 1, HIDDEN))  # too few tokens
        assert not layer.uses_collapsed_attention(torch.zeros(many, HIDDEN // 2 - 1, HIDDEN))  # too short
    assert layer.uses_collapsed_attention(torch.zeros(many // HIDDEN, HIDDEN, HIDDEN))
    assert not layer.uses_collapsed_attention(torch.zeros(many, HIDDEN - 1, HIDDEN))  # with gradients, too short
    for interaction in ("add", "concat"):
        layer = FastformerLayer(tiny_config(interaction=interaction))
        assert not layer.uses_collapsed_attention(torch.zeros(1, 64, HIDDEN))


@pytest.mark.parametrize("implementation", ["plain", "collapsed"])
def test_additive_attention_mode_selects_the_path_at_any_length(build, implementation, monkeypatch):
    """The model's set_additive_attention_mode decides, whatever the length; both give the same model output."""
    model = build(FastformerModel).double()
    model.set_additive_attention_mode(implementation)
    taken = []
    monkeypatch.setattr(FastformerLayer, "collapsed_attention", record_call(FastformerLayer.collapsed_attention, taken))
    ids = torch.randint(1, VOCAB, (2, 3 * HIDDEN // 2))
    for length in (2, 3 * HIDDEN // 2):  # below and above the "auto" threshold of HIDDEN / 2
        taken.clear()
        with torch.no_grad():
            output = model(ids[:, :length]).last_hidden_state
        assert bool(taken) == (implementation == "collapsed")
        model.set_additive_attention_mode("auto" if implementation == "plain" else "plain")
        with torch.no_grad():
            other = model(ids[:, :length]).last_hidden_state
        model.set_additive_attention_mode(implementation)
        torch.testing.assert_close(output, other, rtol=1e-12, atol=1e-12)


def record_call(function, calls):
    def recorded(*args, **kwargs):
        calls.append(True)
        return function(*args, **kwargs)

    return recorded


@pytest.mark.parametrize("model_class", [FastformerModel, FastformerForConditionalGeneration])
def test_set_additive_attention_mode_sets_every_encoder_layer(build, model_class):
    """It sets the mode of every encoder layer (one of each of the three distinct layers here), returns None, and
    leaves the decoder's layers without one."""
    model = build(model_class, share_layers=False)
    layers = [module for module in model.modules() if isinstance(module, FastformerLayer)]
    assert len(layers) == model.config.num_hidden_layers > 1
    assert {layer.attention_mode for layer in layers} == {"auto"}
    for mode in ("plain", "collapsed", "auto"):
        assert model.set_additive_attention_mode(mode) is None
        assert {layer.attention_mode for layer in layers} == {mode}
    assert not any(hasattr(module, "attention_mode") for module in model.modules() if module not in layers)


def test_set_additive_attention_mode_refuses_what_cannot_apply_naming_the_argument(build):
    model = build(FastformerModel)
    with pytest.raises(ValueError, match=r"`mode` must be one of \('auto', 'plain', 'collapsed'\) .*, got 'fast'$"):
        model.set_additive_attention_mode("fast")
    add = build(FastformerModel, interaction="add")
    refusal = '`mode="collapsed"` .* needs `interaction="product"`, got interaction=.add.; use'
    with pytest.raises(ValueError, match=refusal):
        add.set_additive_attention_mode("collapsed")
    for refused in (model, add):  # nothing was set
        assert {layer.attention_mode for layer in refused.base_model.layers} == {"auto"}


def test_collapsed_attention_is_refused_where_it_cannot_apply(build):
    """A layer's mode set on it directly, past the model's checks: refused when it would run."""
    model = build(FastformerModel, interaction="add")
    model.base_model.layers[0].attention_mode = "collapsed"
    with pytest.raises(ValueError, match="needs interaction=\"product\", got interaction='add'"):
        model(torch.randint(1, VOCAB, (1, 4)))
    model.base_model.layers[0].attention_mode = "fast"
    with pytest.raises(ValueError, match="attention_mode must be one of .*, got 'fast'; set it with"):
        model(torch.randint(1, VOCAB, (1, 4)))


# a batch that "auto" folds a plain model's Linear layers for (hidden size 32, 64 positions), and one it does not
FOLDED, NOT_FOLDED = (8, 64), (2, 7)


def padded_batches():
    """(input_ids, attention_mask) of the shapes NOT_FOLDED and FOLDED, the first row half padding."""
    for batch, length in (NOT_FOLDED, FOLDED):
        ids = torch.randint(1, VOCAB, (batch, length))
        mask = torch.ones_like(ids)
        mask[0, length // 2 :] = 0
        yield ids, mask


@pytest.mark.filterwarnings("ignore:torch.ao.quantization is deprecated:DeprecationWarning")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor.*deprecated:UserWarning")
def test_dynamic_quantization_gives_logits_close_to_the_float_models(build):
    """torch.ao's dynamic int8 quantization swaps every nn.Linear, the pooler's too, for one whose weight is a packed
    int8 tensor behind a method: the quantized classifier runs (on the plain attention path where "auto" folds the
    float model's weights), and its logits stay within 5% of the largest float logit."""
    model = build(FastformerForSequenceClassification)
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    assert type(quantized.fastformer.pooler.dense) is not nn.Linear  # it was quantized
    for ids, mask in padded_batches():
        with torch.no_grad():
            expected = model(ids, attention_mask=mask).logits
            found = quantized(ids, attention_mask=mask).logits
        assert 0 < (found - expected).abs().max() <= 0.05 * expected.abs().max()
    hidden_states = torch.zeros(*FOLDED, HIDDEN)
    with torch.no_grad():
        assert model.fastformer.layers[0].uses_collapsed_attention(hidden_states)
        assert not quantized.fastformer.layers[0].uses_collapsed_attention(hidden_states)


def test_a_device_map_that_offloads_to_disk_gives_the_logits_of_the_model(build, tmp_path):
    """accelerate's offload keeps a module's weights on "meta" and loads them around the module's own forward: the
    pooler and layers offloaded to disk give the plain model's logits (on the plain attention path, which calls every
    Linear layer, where "auto" folds the plain model's weights), and an explicit "collapsed" is refused."""
    model = build(FastformerForSequenceClassification, share_layers=False)
    model.save_pretrained(tmp_path / "model")
    device_map = {
        "fastformer.embeddings": "cpu",
        "fastformer.layers.0": "disk",
        "fastformer.layers.1": "cpu",
        "fastformer.layers.2": "disk",
        "fastformer.pooler": "disk",
        "classifier": "cpu",
    }
    offloaded = FastformerForSequenceClassification.from_pretrained(
        tmp_path / "model", device_map=device_map, offload_folder=tmp_path / "offload"
    ).eval()
    assert (
        offloaded.fastformer.pooler.dense.weight.is_meta
        and offloaded.fastformer.layers[0].attention.query.weight.is_meta
    )
    for ids, mask in padded_batches():
        with torch.no_grad():
            expected = model(ids, attention_mask=mask).logits
            torch.testing.assert_close(offloaded(ids, attention_mask=mask).logits, expected, rtol=0, atol=1e-5)
    with torch.no_grad():
        assert model.fastformer.layers[0].uses_collapsed_attention(torch.zeros(*FOLDED, HIDDEN))
    offloaded.set_additive_attention_mode("collapsed")
    with pytest.raises(ValueError, match="offloaded"):
        offloaded(ids, attention_mask=mask)


def test_the_causal_decoder_has_no_collapsed_path(build):
    """The folding needs the whole sequence's global key: no module of a decoder offers it, and the mode leaves
    the decoder's computation exactly as it is."""
    ids = torch.randint(1, VOCAB, (2, 3 * HIDDEN // 2))  # long enough for "auto" to collapse in an encoder
    outputs = []
    for implementation in ("collapsed", "plain"):
        model = build(FastformerForCausalLM)
        model.set_additive_attention_mode(implementation)
        assert not any(hasattr(module, "collapsed_attention") for module in model.modules())
        assert any(isinstance(module, FastformerCausalAttention) for module in model.modules())
        with torch.no_grad():
            outputs.append(model(ids).logits)
    assert torch.equal(*outputs)


@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_all_padding_row_is_finite(build, model_class):
    model = build(model_class)
    ids = torch.randint(1, VOCAB, (2, 6))
    mask = torch.ones_like(ids)
    mask[1] = 0
    with torch.no_grad():
        output = model(ids, attention_mask=mask)
    assert all(torch.isfinite(t).all() for t in output.values() if isinstance(t, torch.Tensor))


# ---- the config switches: behaviour and parameter count exactly as documented ----------------------------------

LINEAR = HIDDEN * HIDDEN + HIDDEN


def test_query_value_sharing_removes_w_v_and_uses_the_query_as_value(build):
    shared = build(FastformerModel, share_layers=False)
    unshared = build(FastformerModel, share_layers=False, share_query_value=False)
    assert all(layer.attention.value is None for layer in shared.layers)
    assert n_params(unshared) - n_params(shared) == LAYERS * LINEAR
    # with W_v := W_q, the unshared model computes exactly what the shared one does
    missing = unshared.load_state_dict(shared.state_dict(), strict=False).missing_keys
    value_keys = [f"layers.{i}.attention.value.{p}" for i in range(LAYERS) for p in ("weight", "bias")]
    assert sorted(missing) == sorted(value_keys)
    for layer in unshared.layers:
        layer.attention.value.load_state_dict(layer.attention.query.state_dict())
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(unshared(ids).last_hidden_state, shared(ids).last_hidden_state)


def test_layer_sharing_applies_one_layer_num_hidden_layers_times(build):
    shared = build(FastformerModel)
    unshared = build(FastformerModel, share_layers=False)
    assert len(shared.layers) == 1 and len(unshared.layers) == LAYERS
    layer_params = n_params(unshared.layers[0])
    assert n_params(unshared) - n_params(shared) == (LAYERS - 1) * layer_params
    state = {k: v for k, v in shared.state_dict().items() if not k.startswith("layers.")}
    for i in range(LAYERS):
        state.update({f"layers.{i}.{k}": v for k, v in shared.layers[0].state_dict().items()})
    unshared.load_state_dict(state)
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        out_shared = shared(ids, output_hidden_states=True)
        out_unshared = unshared(ids, output_hidden_states=True)
    assert len(out_shared.hidden_states) == LAYERS + 1
    torch.testing.assert_close(out_shared.last_hidden_state, out_unshared.last_hidden_state)
    # and the layers really are applied in sequence: each hidden state differs from the previous one
    assert not torch.allclose(out_shared.hidden_states[1], out_shared.hidden_states[2])


@pytest.mark.parametrize("interaction", ["product", "concat"])
def test_head_sharing_keeps_one_w_q_and_w_k_for_all_heads(build, interaction):
    shared = build(FastformerModel, share_heads=True, interaction=interaction)
    per_head = build(FastformerModel, interaction=interaction)
    attention = shared.layers[0].attention
    assert attention.query_weight.shape == attention.key_weight.shape == (1, HEAD_DIM)
    per_head_vectors = 2 * (NUM_HEADS - 1) * HEAD_DIM
    per_head_projections = 2 * (NUM_HEADS - 1) * 2 * HEAD_DIM * HEAD_DIM if interaction == "concat" else 0
    assert n_params(per_head) - n_params(shared) == per_head_vectors + per_head_projections
    # a per-head model whose heads all hold the shared parameters computes the same thing
    target = per_head.state_dict()
    per_head.load_state_dict({name: t.expand(target[name].shape).clone() for name, t in shared.state_dict().items()})
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(per_head(ids).last_hidden_state, shared(ids).last_hidden_state)


def test_interaction_changes_behaviour_and_concat_adds_two_projections_per_layer(build):
    ids = torch.randint(1, VOCAB, (2, 7))
    # a wide init: at std 0.02 the global vectors are tiny and the query residual dominates the output
    product = build(FastformerModel, share_layers=False, initializer_range=0.5)
    outputs = {}
    for interaction in ["product", "add", "concat"]:
        model = build(FastformerModel, share_layers=False, interaction=interaction, initializer_range=0.5)
        extra = n_params(model) - n_params(product)
        assert extra == (LAYERS * 2 * NUM_HEADS * 2 * HEAD_DIM * HEAD_DIM if interaction == "concat" else 0)
        model.load_state_dict(product.state_dict(), strict=interaction != "concat")
        with torch.no_grad():
            outputs[interaction] = model(ids).last_hidden_state
    assert not torch.allclose(outputs["product"], outputs["add"], atol=1e-3)
    assert not torch.allclose(outputs["product"], outputs["concat"], atol=1e-3)


def test_pooler_types(build):
    ids = torch.randint(1, VOCAB, (2, 7))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding: the first real token of row 1 is at position 3
    poolers = {}
    for pooler_type in ["additive", "cls", "mean", "cls_tanh", "cls_relu", "cls_gelu"]:
        model = build(FastformerModel, pooler_type=pooler_type)
        with torch.no_grad():
            output = model(ids, attention_mask=mask)
        poolers[pooler_type] = n_params(model.pooler)
        hidden = output.last_hidden_state
        if pooler_type == "cls":
            torch.testing.assert_close(output.pooler_output, torch.stack([hidden[0, 0], hidden[1, 3]]))
        elif pooler_type == "mean":
            torch.testing.assert_close(output.pooler_output, torch.stack([hidden[0].mean(0), hidden[1, 3:].mean(0)]))
        elif pooler_type.startswith("cls_"):  # BERT's pooler: dense + tanh on the first token (relu, gelu: alike)
            activation = {"cls_tanh": torch.tanh, "cls_relu": torch.relu, "cls_gelu": torch.nn.functional.gelu}
            first = model.pooler.dense(torch.stack([hidden[0, 0], hidden[1, 3]]))
            torch.testing.assert_close(output.pooler_output, activation[pooler_type](first))
        else:
            scores = torch.tanh(model.pooler.dense(hidden)) @ model.pooler.score.weight[0]  # s . tanh(W h_i + b)
            weights = scores.masked_fill(mask == 0, float("-inf")).softmax(-1)
            torch.testing.assert_close(output.pooler_output, (weights[..., None] * hidden).sum(1))
    expected = {"additive": LINEAR + HIDDEN, "cls": 0, "mean": 0}  # the score has no bias (shift-free)
    assert poolers == expected | dict.fromkeys(["cls_tanh", "cls_relu", "cls_gelu"], LINEAR)


# ---- PreTrainedModel API --------------------------------------------------------------------------------------


def test_output_attentions_are_the_two_pooling_distributions_per_layer(build):
    model = build(FastformerModel, share_layers=False)
    ids = torch.randint(1, VOCAB, (2, 7))
    mask = torch.ones_like(ids)
    mask[0, 5:] = 0
    with torch.no_grad():
        output = model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
    assert len(output.attentions) == LAYERS and len(output.hidden_states) == LAYERS + 1
    for weights in output.attentions:
        assert weights.shape == (2, NUM_HEADS, 2, 7)
        torch.testing.assert_close(weights.sum(-1), torch.ones(2, NUM_HEADS, 2))
        assert torch.all(weights[0, :, :, 5:] == 0)
    torch.testing.assert_close(output.hidden_states[-1], output.last_hidden_state)


def test_return_dict_false_gives_a_tuple(build):
    model = build(FastformerForSequenceClassification)
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        loss, logits = model(ids, labels=torch.tensor([0, 2]), return_dict=False)
        assert torch.equal(logits, model(ids).logits)


def test_inputs_embeds_equal_input_ids(build):
    model = build(FastformerForMaskedLM)
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        torch.testing.assert_close(model(inputs_embeds=embeds).logits, model(ids).logits)


@pytest.mark.parametrize(
    "problem_type, labels, loss_fn",
    [
        ("single_label_classification", torch.tensor([0, 2]), torch.nn.functional.cross_entropy),
        (
            "multi_label_classification",
            torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
            torch.nn.functional.binary_cross_entropy_with_logits,
        ),
        ("regression", torch.tensor([[0.5, -1.0, 2.0], [1.0, 0.0, 0.0]]), torch.nn.functional.mse_loss),
    ],
)
def test_sequence_classification_problem_types(build, problem_type, labels, loss_fn):
    model = build(FastformerForSequenceClassification, problem_type=problem_type)
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        output = model(ids, labels=labels)
    torch.testing.assert_close(output.loss, loss_fn(output.logits, labels))


def test_problem_type_is_inferred_from_labels_as_in_transformers(build):
    model = build(FastformerForSequenceClassification)
    model(torch.randint(1, VOCAB, (2, 7)), labels=torch.tensor([1, 2]))
    assert model.config.problem_type == "single_label_classification"
    model = build(FastformerForSequenceClassification, num_labels=1)
    output = model(torch.randint(1, VOCAB, (2, 7)), labels=torch.tensor([0.3, -0.2]))
    assert model.config.problem_type == "regression" and output.logits.shape == (2, 1)


def test_masked_lm_loss_ignores_unmasked_positions_and_ties_embeddings(build):
    model = build(FastformerForMaskedLM)
    assert model.lm_head.decoder.weight is model.fastformer.embeddings.word_embeddings.weight
    untied = build(FastformerForMaskedLM, tie_word_embeddings=False)
    assert n_params(untied) - n_params(model) == VOCAB * HIDDEN
    ids = torch.randint(1, VOCAB, (2, 7))
    labels = torch.full_like(ids, -100)
    labels[0, 2], labels[1, 4] = 5, 6
    with torch.no_grad():
        output = model(ids, labels=labels)
    expected = torch.nn.functional.cross_entropy(output.logits[[0, 1], [2, 4]], torch.tensor([5, 6]))
    torch.testing.assert_close(output.loss, expected)


def test_resize_token_embeddings_keeps_weights_tied(build):
    model = build(FastformerForMaskedLM)
    model.resize_token_embeddings(VOCAB + 5)
    assert model.config.vocab_size == VOCAB + 5
    assert model.lm_head.decoder.weight is model.fastformer.embeddings.word_embeddings.weight
    assert model.lm_head.decoder.bias.shape == (VOCAB + 5,)
    with torch.no_grad():
        assert model(torch.tensor([[VOCAB + 4, 3]])).logits.shape == (1, 2, VOCAB + 5)


@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_save_and_load_give_bit_identical_weights_and_outputs(build, model_class, tmp_path):
    model = build(model_class, share_layers=False, interaction="concat")
    model.save_pretrained(tmp_path)
    files = {p.name for p in tmp_path.iterdir()}
    assert "model.safetensors" in files and not {"pytorch_model.bin", "model.bin"} & files
    loaded = model_class.from_pretrained(tmp_path).eval()
    saved = dict(model.state_dict())
    assert saved.keys() == loaded.state_dict().keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved[name]), name
    ids = torch.randint(1, VOCAB, (2, 7))
    mask = torch.tensor([[1] * 7, [0] * 2 + [1] * 5])
    with torch.no_grad():
        for key, value in model(ids, attention_mask=mask).items():
            assert torch.equal(loaded(ids, attention_mask=mask)[key], value), key


@pytest.mark.parametrize(
    "auto_class, model_class",
    [
        (AutoModel, FastformerModel),
        (AutoModelForSequenceClassification, FastformerForSequenceClassification),
        (AutoModelForMaskedLM, FastformerForMaskedLM),
    ],
)
def test_auto_classes(build, tiny_config, auto_class, model_class, tmp_path):
    assert isinstance(AutoConfig.for_model("fastformer"), FastformerConfig)
    config = tiny_config()
    assert type(auto_class.from_config(config)) is model_class
    build(FastformerForMaskedLM).save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path)
    assert type(loaded) is model_class
    assert type(AutoConfig.from_pretrained(tmp_path)) is FastformerConfig


def test_from_pretrained_dtype_and_device_map(build, tmp_path):
    model = build(FastformerForSequenceClassification)
    model.save_pretrained(tmp_path)
    half = FastformerForSequenceClassification.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert half.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in half.parameters())
    ids = torch.randint(1, VOCAB, (2, 7))
    with torch.no_grad():
        logits = half(ids).logits
        reference = model(ids).logits
    assert logits.dtype == torch.bfloat16
    torch.testing.assert_close(logits.float(), reference, rtol=0.05, atol=0.05)
    mapped = FastformerForSequenceClassification.from_pretrained(tmp_path, device_map="auto")
    assert all(p.device.type == "cpu" for p in mapped.parameters())
    with torch.no_grad():
        assert torch.equal(mapped(ids).logits, reference)


def test_gradient_checkpointing_gives_the_same_gradients(build):
    def gradients(checkpointing):
        model = build(FastformerForSequenceClassification, share_layers=False).train()  # dropout is 0
        if checkpointing:
            model.activation_checkpointing_enable()
            assert all(layer.gradient_checkpointing for layer in model.fastformer.layers)
        ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
        model(ids, labels=torch.tensor([0, 2])).loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    plain, checkpointed = gradients(False), gradients(True)
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-6, atol=1e-7, msg=name)


def test_invalid_inputs_raise_clear_errors(build):
    model = build(FastformerModel)
    ids = torch.randint(1, VOCAB, (2, 7))
    with pytest.raises(ValueError, match="exactly one of `input_ids` and `inputs_embeds`"):
        model(ids, inputs_embeds=torch.zeros(2, 7, HIDDEN))
    with pytest.raises(ValueError, match=r"`attention_mask` must have shape .* \(2, 7\), got \(2, 6\)"):
        model(ids, attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match="`input_ids` sequence reaches more than 64 positions"):
        model(torch.ones(1, 65, dtype=torch.long))


def test_trainer_two_steps_give_a_finite_loss_and_change_the_weights(build, tmp_path):
    model = build(FastformerForSequenceClassification).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    generator = torch.Generator().manual_seed(0)
    dataset = [
        {"input_ids": torch.randint(1, VOCAB, (7,), generator=generator), "labels": torch.tensor(i % 3)}
        for i in range(8)
    ]
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    result = Trainer(model=model, args=args, train_dataset=dataset).train()
    assert result.global_step == 2 and torch.isfinite(torch.tensor(result.training_loss))
    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before[name])]
    assert "classifier.weight" in changed and "fastformer.layers.0.attention.query_weight" in changed


def test_init_weights_follow_initializer_range(build):
    model = build(FastformerForMaskedLM, initializer_range=0.1, interaction="concat")
    attention = model.fastformer.layers[0].attention
    for name in ["query_weight", "key_weight", "query_key_projection", "key_value_projection"]:
        assert 0.06 < getattr(attention, name).std() < 0.14, name
    assert 0.09 < attention.query.weight.std() < 0.11 and torch.all(attention.query.bias == 0)
    embeddings = model.fastformer.embeddings
    assert torch.all(embeddings.word_embeddings.weight[0] == 0)  # pad_token_id
    assert torch.all(embeddings.layer_norm.weight == 1) and torch.all(embeddings.layer_norm.bias == 0)


EVERY_HEAD = [*HEADS, FastformerForConditionalGeneration, FastformerForCausalLM]


def training_loss(model, ids, **inputs):
    """A loss that reads every output of `model` (the encoder's pooled vector too)."""
    if model.config.is_encoder_decoder:
        return model(ids, decoder_input_ids=ids[:, :3], labels=ids[:, :3], **inputs).loss
    if isinstance(model, FastformerModel):
        output = model(ids, **inputs)
        return output.last_hidden_state.pow(2).mean() + output.pooler_output.pow(2).mean()
    labels = torch.zeros(len(ids), dtype=torch.long) if isinstance(model, FastformerForSequenceClassification) else ids
    return model(ids, labels=labels, **inputs).loss


@pytest.mark.parametrize("model_class", EVERY_HEAD, ids=lambda c: c.__name__)
def test_token_types_start_at_zero_and_are_learned(build, model_class):
    """Segment embeddings as BERT's (tests/test_peer_recipes.py compares a text pair's with BERT's): the table starts
    at zero, so a new model's outputs are those without token types; a training step on text pairs teaches the
    second segment's row (row 0 stays zero: no gradient), which then moves the outputs, while no `token_type_ids`
    and a BERT tokenizer's zeros still give the same ones. The encoder-decoder's are its encoder's."""
    model = build(model_class)
    table = next(module for module in model.modules() if isinstance(module, FastformerTokenTypeEmbeddings)).weight
    assert not table.any()
    ids = torch.randint(1, VOCAB, (2, 7))
    segments = torch.zeros_like(ids)
    segments[:, 4:] = 1
    training_loss(model.train(), ids, token_type_ids=segments).backward()
    assert not table.grad[0].any() and table.grad[1].any()
    torch.optim.SGD([table], lr=1.0).step()
    inputs = {"decoder_input_ids": ids[:, :3]} if model.config.is_encoder_decoder else {}
    with torch.no_grad():
        reference = model.eval()(ids, **inputs)
        zeros = model(ids, token_type_ids=torch.zeros_like(ids), **inputs)
        pair = model(ids, token_type_ids=segments, **inputs)
    for key, value in reference.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(zeros[key], value), key
    main = "last_hidden_state" if model_class is FastformerModel else "logits"
    assert (pair[main] - reference[main]).abs().max() > 1e-5


@pytest.mark.parametrize("model_class", EVERY_HEAD, ids=lambda c: c.__name__)
def test_a_training_step_without_token_types_reaches_every_parameter(build, model_class):
    """Every parameter gets a gradient, the token-type table's too where no `token_type_ids` are given (as BERT's
    does): DDP without `find_unused_parameters` (accelerate's default; the Trainer's under gradient checkpointing)
    fails at the next step on a parameter that gets none, and FSDP expects one for each."""
    model = build(model_class).train()
    training_loss(model, torch.randint(1, VOCAB, (2, 7))).backward()
    assert [name for name, parameter in model.named_parameters() if parameter.grad is None] == []


def test_packed_rows_longer_than_the_positions_train_without_token_types(build):
    """A row of DataCollatorWithFlattening may hold more tokens than `max_position_embeddings` (its positions restart
    at each sequence): the type-0 lookup of a training step covers any length."""
    model = build(FastformerForMaskedLM).train()
    ids = torch.randint(1, VOCAB, (1, 80))
    model(ids, position_ids=torch.arange(40).repeat(2)[None], labels=ids).loss.backward()
    assert model.fastformer.embeddings.token_type_embeddings.weight.grad is not None


@pytest.mark.parametrize("model_class", HEADS, ids=lambda c: c.__name__)
def test_forward_takes_arguments_in_berts_order_and_ignores_unknown_keywords(build, model_class):
    names = list(inspect.signature(model_class.forward).parameters)[1:6]
    assert names == ["input_ids", "attention_mask", "token_type_ids", "position_ids", "inputs_embeds"]
    model = build(model_class)
    ids = torch.randint(1, VOCAB, (2, 5))
    mask, types = torch.ones_like(ids), torch.zeros_like(ids)
    expected = split_outputs(model(ids, attention_mask=mask, token_type_ids=types))
    with torch.no_grad():
        got = split_outputs(model(ids, mask, types, some_future_argument=True))
    for a, b in zip(got, expected):
        assert (a is None and b is None) or torch.equal(a, b)


@pytest.mark.parametrize(
    "model_class, sums_over_items",
    [(FastformerForSequenceClassification, False), (FastformerForMaskedLM, True), (FastformerForCausalLM, True)],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_trainer_knows_which_losses_take_num_items_in_batch(build, model_class, sums_over_items, tmp_path):
    """A model whose forward takes **kwargs looks to the Trainer as if its loss were summed over
    `num_items_in_batch`; the classifier's is a batch mean, and under DDP that mistake scaled its gradients by the
    number of processes (tests/test_scripts.py compares DDP with one process)."""
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = Trainer(model=build(model_class), args=args)
    assert trainer.model_accepts_loss_kwargs is sums_over_items


@pytest.mark.slow
def test_building_a_model_changes_no_global_state(fresh_python, tmp_path):
    """Registration happens once, in `import fastformer`: in a fresh interpreter, building a model of every head
    leaves transformers' tables, PEFT's tables and the classes as the import left them."""
    script = """
import copy
import fastformer
from peft.utils import constants
from transformers.models.auto import modeling_auto

heads = [getattr(fastformer, name) for name in fastformer.__all__ if name.startswith("FastformerFor")]
heads.append(fastformer.FastformerModel)

def state():
    tables = {name: table for name, table in vars(modeling_auto).items() if name.endswith("_MAPPING_NAMES")}
    peft_tables = {name: table for name, table in vars(constants).items() if name.endswith("_MAPPING")}
    return copy.deepcopy((tables, peft_tables, {cls: cls._auto_class for cls in heads}))

before = state()
assert "fastformer" in before[1]["TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING"]
config = fastformer.FastformerConfig(hidden_size=32, num_attention_heads=4, intermediate_size=37)
for head in heads:
    head(config)
assert state() == before
print("unchanged")
"""
    assert fresh_python(script, tmp_path).strip() == "unchanged"
