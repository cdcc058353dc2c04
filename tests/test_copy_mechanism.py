"""The copy head of FastformerCopyForConditionalGeneration (See et al.'s pointer-generator), with and
without the span gate (`copy_spans`) and the source context (`copy_context_window`), and the same head on BERT2BERT
(`CopyEncoderDecoderModel`): the math against fastformer.naive's float64 loop, each model's logits against the same
loop on its own states, and the recipes a seq2seq model serves (teacher forcing, greedy and beam search with the
cache, save and reload)."""

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig, AutoModelForSeq2SeqLM, BertConfig, BertLMHeadModel, BertModel

from bert2bert import CopyEncoderDecoderModel, bert2bert_model
from fastformer import (
    FastformerConfig,
    FastformerCopyConfig,
    FastformerCopyForConditionalGeneration,
    FastformerForConditionalGeneration,
    naive,
)
from fastformer.checks import value_checks
from fastformer.functional import copy_attention, pointer_generator, source_context, span_continuations

SPECIAL = dict(pad_token_id=0, decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)


def source_batch():
    """Right-padded source ids (row 1 shorter, one id twice in row 0) and their mask."""
    ids = torch.tensor([[5, 9, 5, 12, 30, 7], [8, 14, 3, 0, 0, 0]])
    return ids, ids != 0


@pytest.fixture(scope="module")
def fastformer_model(build):
    # larger initial weights and a gate bias near 0: both distributions matter in every logit
    return build(FastformerCopyForConditionalGeneration, initializer_range=0.3, **SPECIAL)


def tiny_bert2bert(copy_spans=False, copy_context_window=0):
    """A tiny BERT2BERT with the copy head, sized and initialized as the tiny Fastformer."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = BertConfig(**sizes, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0)
    decoder_config = BertConfig(**config.to_dict() | dict(is_decoder=True, add_cross_attention=True))
    decoder_config.copy_spans = copy_spans
    decoder_config.copy_context_window = copy_context_window
    encoder, decoder = BertModel(config, add_pooling_layer=False), BertLMHeadModel(decoder_config)
    model = CopyEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.update(SPECIAL)
    model.generation_config.update(**SPECIAL)
    return model.eval()


def with_random_span_gate(model):
    """`model` after its span gate starts (u = 0, c = 4) are checked, given a gate that differs per token: every
    logit then depends on it."""
    gate = model.copy_head.span_gate
    assert torch.equal(gate.weight, torch.zeros_like(gate.weight)) and gate.bias.item() == 4.0
    with torch.no_grad():
        gate.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(0))
        gate.bias.fill_(1.0)
    return model


def with_random_source_context(model):
    """`model` after its source context's start (zero: the keys are the encoder's outputs) is checked, given
    weights that change every key."""
    context = model.copy_head.source_context
    assert torch.equal(context.weight, torch.zeros_like(context.weight))
    with torch.no_grad():
        context.weight.normal_(0.0, 0.5, generator=torch.Generator().manual_seed(1))
    return model


def copy_model(name, build, fastformer_model):
    """ "fastformer" or "bert2bert", then "-spans" with the span gate or "-context" with a source context of 3
    tokens."""
    if name == "fastformer":
        return fastformer_model
    if name == "bert2bert":
        return tiny_bert2bert()
    family, _, lever = name.partition("-")
    levers = dict(copy_spans=lever == "spans", copy_context_window=3 if lever == "context" else 0)
    if family == "bert2bert":
        model = tiny_bert2bert(**levers)
    else:
        overrides = dict(initializer_range=0.3, **levers)
        model = build(FastformerCopyForConditionalGeneration, **overrides, **SPECIAL)
    return with_random_span_gate(model) if levers["copy_spans"] else with_random_source_context(model)


@pytest.fixture(
    scope="module",
    params=[f"{family}{lever}" for lever in ("", "-spans", "-context") for family in ("fastformer", "bert2bert")],
)
def model(request, build, fastformer_model):
    """Each model with the copy head: alone, with the span gate, and with the source context. The recipes below are
    the same for all."""
    return copy_model(request.param, build, fastformer_model)


@pytest.fixture(scope="module", params=["fastformer-spans", "bert2bert-spans"])
def span_model(request, build, fastformer_model):
    """Each model with the span gate."""
    return copy_model(request.param, build, fastformer_model)


def lm_head(model):
    return model.lm_head if isinstance(model, FastformerForConditionalGeneration) else model.decoder.cls


def test_span_continuations_are_the_positions_after_each_occurrence_of_the_input_token():
    ids, _ = source_batch()  # [[5, 9, 5, 12, 30, 7], [8, 14, 3, 0, 0, 0]]
    inputs = torch.tensor([[5, 7, 1], [14, 0, 8]])
    continuations = span_continuations(ids, inputs)
    assert continuations.shape == (2, 3, 6) and continuations.dtype == torch.bool
    assert continuations[0, 0].nonzero().flatten().tolist() == [1, 3]  # 5 is followed by 9 and by 12
    assert not continuations[0, 1].any()  # 7 ends the source
    assert not continuations[0, 2].any()  # the start token is not in the source
    assert continuations[1, 0].nonzero().flatten().tolist() == [2]
    assert continuations[1, 1].nonzero().flatten().tolist() == [4, 5]  # after padding: masked by the attention
    assert continuations[1, 2].nonzero().flatten().tolist() == [1]


@pytest.mark.parametrize("spans", [False, True], ids=["", "spans"])
@pytest.mark.parametrize("all_padding", [False, True])
def test_pointer_generator_matches_the_float64_loop(all_padding, spans):
    generator = torch.Generator().manual_seed(0)
    ids, mask = source_batch()
    if all_padding:
        mask[1] = False
    logits = torch.randn(2, 4, 40, generator=generator, dtype=torch.float64)
    query = torch.randn(2, 4, 8, generator=generator, dtype=torch.float64)
    source = torch.randn(2, 6, 8, generator=generator, dtype=torch.float64)
    gate = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    inputs, span_gate, bias = torch.tensor([[1, 5, 9, 30], [8, 14, 3, 0]]), None, None
    if spans:
        span_gate = 3 * torch.randn(2, 4, generator=generator, dtype=torch.float64)
        bias = span_gate[..., None] * span_continuations(ids, inputs)
    weights, context = copy_attention(query, source, mask, bias)
    log_p = pointer_generator(logits, weights, ids, gate)
    expected = naive.pointer_generator(logits, query, source, mask, ids, gate, inputs, span_gate)
    torch.testing.assert_close(log_p, expected)
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 4, dtype=torch.float64))
    assert torch.isfinite(log_p).all() and torch.isfinite(context).all()
    if not all_padding:
        assert (weights[1, :, 3:] == 0).all()  # padding gets no weight


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("all_padding", [False, True])
def test_source_context_matches_the_float64_loop_and_ignores_padding(all_padding, window):
    generator = torch.Generator().manual_seed(0)
    _, mask = source_batch()
    if all_padding:
        mask[1] = False
    source = torch.randn(2, 6, 8, generator=generator)
    weight = torch.randn(8, 1, window, generator=generator)
    out = source_context(source, weight, mask)
    torch.testing.assert_close(out.double(), naive.source_context(source, weight, mask), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(source_context(source, torch.zeros_like(weight), mask)[mask], source[mask])
    # a real token's output is what it has without the padding, or with other padding values
    noisy = source.masked_fill(~mask[..., None], 7.0)
    torch.testing.assert_close(source_context(noisy, weight, mask)[mask], out[mask])
    if not all_padding:
        torch.testing.assert_close(source_context(source[1:, :3], weight)[0], out[1, :3])
    gradients = torch.autograd.grad(source_context(source, weight.requires_grad_(), mask).sum(), weight)[0]
    assert gradients.abs().sum() > 0


def test_pointer_generator_gradients_gradcheck():
    generator = torch.Generator().manual_seed(1)
    ids, mask = source_batch()
    tensors = [
        torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
        for shape in ((2, 2, 31), (2, 2, 4), (2, 6, 4), (2, 2))
    ]

    def log_p(logits, query, source, gate):
        weights, _ = copy_attention(query, source, mask)
        return pointer_generator(logits, weights, ids, gate)

    assert torch.autograd.gradcheck(log_p, tensors)


@torch.no_grad()
def test_model_logits_are_the_pointer_generator_of_its_own_states(model):
    ids, mask = source_batch()
    targets = torch.tensor([[1, 5, 9, 4], [1, 3, 8, 2]])
    out = model(input_ids=ids, attention_mask=mask, decoder_input_ids=targets, output_hidden_states=True)
    hidden, encoded = out.decoder_hidden_states[-1], out.encoder_last_hidden_state
    head = model.copy_head
    plain = lm_head(model)(hidden)
    span_gate = bias = None
    if head.span_gate is not None:
        span_gate = head.span_gate(hidden).squeeze(-1)
        bias = span_gate[..., None] * span_continuations(ids, targets)
    if head.source_context is not None:
        encoded = naive.source_context(encoded, head.source_context.weight, mask).float()
    context = copy_attention(head.query(hidden), encoded, mask, bias)[1]
    gate = head.gate(torch.cat([hidden, context], -1)).squeeze(-1)
    expected = naive.pointer_generator(plain, head.query(hidden), encoded, mask, ids, gate, targets, span_gate)
    torch.testing.assert_close(out.logits.double(), expected, rtol=1e-5, atol=1e-5)
    # the source's padding changes nothing for the real tokens
    short = model(input_ids=ids[1:, :3], attention_mask=mask[1:, :3], decoder_input_ids=targets[1:])
    torch.testing.assert_close(short.logits, out.logits[1:], rtol=1e-5, atol=1e-5)
    # the same model without the copy head: its logits are the LM head's
    assert not torch.allclose(out.logits.log_softmax(-1), plain.log_softmax(-1), atol=1e-3)


def test_copy_head_is_a_class_of_its_own_and_saved_with_its_weights(build, model, tmp_path):
    if isinstance(model, FastformerForConditionalGeneration):
        assert not hasattr(build(FastformerForConditionalGeneration), "copy_head")
        assert model.config.model_type == "fastformer_copy"
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded).__name__ == type(model).__name__  # scripts/ may be imported under two names
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name


def test_training_loss_is_the_negative_log_likelihood_and_reaches_the_gate(model):
    ids, mask = source_batch()
    labels = torch.tensor([[5, 12, 2], [14, 8, 2]])
    model.train()
    try:
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
    finally:
        model.eval()
    expected = -out.logits.gather(-1, labels[..., None]).mean()
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert model.copy_head.gate.weight.grad.abs().sum() > 0 and model.copy_head.query.weight.grad.abs().sum() > 0
    if model.copy_head.span_gate is not None:  # labels 5 then 12: the second continues the source's 5 12
        assert model.copy_head.span_gate.weight.grad.abs().sum() > 0
    if model.copy_head.source_context is not None:
        assert model.copy_head.source_context.weight.grad.abs().sum() > 0
    model.zero_grad()


def test_copy_spans_needs_the_copy_head_and_the_decoder_input_ids(tiny_config, span_model):
    with pytest.raises(ValueError, match="`copy_spans` is a field of FastformerCopyConfig"):
        FastformerConfig(copy_spans=True)
    with pytest.raises(ValueError, match="`copy_spans` .* needs `copy_mechanism=True`"):
        bert2bert_model("unused", copy_spans=True)
    ids, mask = source_batch()
    embeds = span_model.get_decoder().get_input_embeddings()(torch.tensor([[1, 5], [1, 8]]))
    with pytest.raises(ValueError, match="config.copy_spans .* pass `decoder_input_ids`"):
        span_model(input_ids=ids, attention_mask=mask, decoder_inputs_embeds=embeds)


def test_copy_context_window_needs_the_copy_head_and_an_odd_window_of_3_or_more(tiny_config):
    with pytest.raises(ValueError, match="`copy_context_window` is a field of FastformerCopyConfig"):
        FastformerConfig(copy_context_window=3)
    with pytest.raises(ValueError, match="`copy_context_window` .* needs `copy_mechanism=True`"):
        bert2bert_model("unused", copy_context_window=3)
    for window in (4, 1, -3):
        error = f"`copy_context_window` must be 0 .* got {window}"
        with pytest.raises(StrictDataclassClassValidationError, match=error):
            tiny_config(copy_context_window=window)
        with pytest.raises(ValueError, match=error):
            tiny_bert2bert(copy_context_window=window)  # a decoder config's field, read by the copy head


def test_a_span_gate_and_source_context_added_to_a_saved_copy_head_start_as_new_ones(build, fastformer_model, tmp_path):
    """A checkpoint saved without them, loaded with `copy_spans` and `copy_context_window`: the gate starts at u = 0,
    c = 4 and the context at zero (as the model's `_init_weights` sets them, also on BERT2BERT) and every saved
    weight is kept."""
    for name, model in (("fastformer", fastformer_model), ("bert2bert", tiny_bert2bert())):
        model.save_pretrained(tmp_path / name)
        config = AutoConfig.from_pretrained(tmp_path / name)
        assert name == "bert2bert" or isinstance(config, FastformerCopyConfig)
        (config if name == "fastformer" else config.decoder).copy_spans = True
        (config if name == "fastformer" else config.decoder).copy_context_window = 3
        loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / name, config=config)
        gate, context = loaded.copy_head.span_gate, loaded.copy_head.source_context.weight
        assert torch.equal(gate.weight, torch.zeros_like(gate.weight)) and gate.bias.item() == 4.0, name
        assert context.shape == (32, 1, 3) and torch.equal(context, torch.zeros_like(context)), name
        for key, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], tensor), (name, key)


def test_copy_head_refuses_a_boolean_logits_to_keep(fastformer_model):
    ids, mask = source_batch()
    with pytest.raises(ValueError, match="pass `logits_to_keep` as a count or as positions"):
        fastformer_model(
            input_ids=ids,
            attention_mask=mask,
            decoder_input_ids=ids[:, :2],
            logits_to_keep=torch.ones_like(ids[:, :2]).bool(),
        )


@torch.no_grad()
def test_a_span_gate_that_always_continues_copies_the_source_in_order(span_model):
    """With the gate always copying and the span gate large, every token after the first continues the span the
    previous one ends (where the source goes on): the source is written in order."""
    model = span_model
    ids, mask = torch.tensor([[5, 9, 11, 12, 30, 7], [8, 14, 3, 0, 0, 0]]), source_batch()[1]
    head = model.copy_head
    saved = {name: tensor.clone() for name, tensor in head.state_dict().items()}
    head.gate.bias.fill_(-30.0)
    head.span_gate.weight.zero_()
    head.span_gate.bias.fill_(40.0)
    try:
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5)
    finally:
        head.load_state_dict(saved)
    continued = 0
    for row, source in zip(generated[:, 1:].tolist(), ids.tolist()):
        source = [token for token in source if token]
        for previous, token in zip(row, row[1:]):
            if source.index(previous) + 1 < len(source):
                assert token == source[source.index(previous) + 1], (row, source)
                continued += 1
    assert continued >= 2


def test_source_ids_are_needed_beside_encoder_outputs(model):
    ids, mask = source_batch()
    encoder_outputs = model.get_encoder()(ids, attention_mask=mask)
    decoder_input_ids = torch.tensor([[1], [1]])
    with pytest.raises(ValueError, match="pass `input_ids`, or `source_ids`"):
        model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=decoder_input_ids)
    with pytest.raises(ValueError, match=r"`source_ids` \(2, 3\) must be the source's ids"):
        model(
            encoder_outputs=encoder_outputs,
            attention_mask=mask,
            decoder_input_ids=decoder_input_ids,
            source_ids=ids[:, :3],
        )
    with torch.no_grad():
        given = model(
            encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=decoder_input_ids, source_ids=ids
        )
        full = model(input_ids=ids, attention_mask=mask, decoder_input_ids=decoder_input_ids)
    torch.testing.assert_close(given.logits, full.logits)


@pytest.mark.parametrize("num_beams", [1, 3])
@torch.no_grad()
def test_generation_with_the_cache_scores_as_one_pass(model, num_beams):
    """generate()'s per-step logits (greedy) or its sequences' scores (beams) are what one forward over the
    generated tokens gives: the source ids reach every step, expanded with the beams."""
    ids, mask = source_batch()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=6,
        min_new_tokens=6,
        length_penalty=0.0,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    sequences = out.sequences
    one_pass = model(input_ids=ids, attention_mask=mask, decoder_input_ids=sequences).logits[:, :-1]
    if num_beams == 1:
        torch.testing.assert_close(torch.stack(out.logits, 1), one_pass, rtol=1e-4, atol=1e-4)
        # without the cache every step runs the whole prefix: its last position's logits are the same
        uncached = model.generate(
            input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=6, use_cache=False
        )
        assert torch.equal(uncached, sequences)
    else:  # the score of a sequence: the sum of its tokens' log-probabilities (length_penalty 0)
        chosen = one_pass.log_softmax(-1).gather(-1, sequences[:, 1:, None]).squeeze(-1).sum(-1)
        torch.testing.assert_close(out.sequences_scores, chosen, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_a_gate_that_always_copies_writes_source_tokens_only(model):
    ids, mask = source_batch()
    bias = model.copy_head.gate.bias.clone()
    model.copy_head.gate.bias.fill_(-30.0)  # p_gen ~ 1e-13
    try:
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5)
    finally:
        model.copy_head.gate.bias.copy_(bias)
    for row, source in zip(generated[:, 1:], ids):
        assert set(row.tolist()) <= set(source[source != 0].tolist())


@torch.no_grad()
def test_generation_from_encoder_outputs_needs_the_source_ids(model):
    ids, mask = source_batch()
    encoder_outputs = model.get_encoder()(ids, attention_mask=mask)
    settings = dict(attention_mask=mask, max_new_tokens=4, num_beams=2, num_return_sequences=2, do_sample=False)
    expected = model.generate(input_ids=ids, **settings)
    given = model.generate(encoder_outputs=encoder_outputs, source_ids=ids, **settings)
    assert expected.shape[0] == 4 and torch.equal(given, expected)
    with pytest.raises(ValueError, match="pass `input_ids`, or `source_ids`"):
        model.generate(encoder_outputs=model.get_encoder()(ids, attention_mask=mask), **settings)
    with value_checks(), pytest.raises(ValueError, match=r"`source_ids` holds the id 99, outside the vocabulary"):
        model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :1], source_ids=torch.full_like(ids, 99))


@pytest.mark.parametrize("name", ["fastformer", "fastformer-spans", "fastformer-context"])
@torch.no_grad()
def test_half_precision_copy_attention_sums_to_one(build, fastformer_model, name):
    ids, mask = source_batch()
    full = copy_model(name, build, fastformer_model)
    half = type(full)(full.config).to(torch.bfloat16).eval()
    half.load_state_dict(full.state_dict())
    log_p = half(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor([[1, 5], [1, 8]])).logits
    assert log_p.dtype == torch.float32 and torch.isfinite(log_p).all()
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 2), rtol=0, atol=1e-5)
