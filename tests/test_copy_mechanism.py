"""The opt-in copy mechanism of FastformerForConditionalGeneration (See et al.'s pointer-generator), and the same
head on BERT2BERT (`CopyEncoderDecoderModel`): the math against fastformer.naive's float64 loop, each model's
logits against the same loop on its own states, and the recipes a seq2seq model serves (teacher forcing, greedy
and beam search with the cache, save and reload)."""

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, BertConfig, BertLMHeadModel, BertModel

from fastformer import FastformerForConditionalGeneration, naive
from fastformer.checks import value_checks
from fastformer.copy_encoder_decoder import CopyEncoderDecoderModel
from fastformer.functional import copy_attention, pointer_generator

SPECIAL = dict(pad_token_id=0, decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)


def source_batch():
    """Right-padded source ids (row 1 shorter, one id twice in row 0) and their mask."""
    ids = torch.tensor([[5, 9, 5, 12, 30, 7], [8, 14, 3, 0, 0, 0]])
    return ids, ids != 0


@pytest.fixture(scope="module")
def fastformer_model(build):
    # larger initial weights and a gate bias near 0: both distributions matter in every logit
    return build(FastformerForConditionalGeneration, copy_mechanism=True, initializer_range=0.3, **SPECIAL)


def tiny_bert2bert():
    """A tiny BERT2BERT with the copy head, sized and initialized as the tiny Fastformer."""
    torch.manual_seed(0)
    sizes = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = BertConfig(**sizes, max_position_embeddings=64, initializer_range=0.3, pad_token_id=0)
    decoder_config = BertConfig(**config.to_dict() | dict(is_decoder=True, add_cross_attention=True))
    encoder, decoder = BertModel(config, add_pooling_layer=False), BertLMHeadModel(decoder_config)
    model = CopyEncoderDecoderModel(encoder=encoder, decoder=decoder)
    model.config.update(SPECIAL)
    model.generation_config.update(**SPECIAL)
    return model.eval()


@pytest.fixture(scope="module", params=["fastformer", "bert2bert"])
def model(request, fastformer_model):
    """Each model with the copy head: the recipes below are the same for both."""
    return fastformer_model if request.param == "fastformer" else tiny_bert2bert()


def lm_head(model):
    return model.lm_head if isinstance(model, FastformerForConditionalGeneration) else model.decoder.cls


@pytest.mark.parametrize("all_padding", [False, True])
def test_pointer_generator_matches_the_float64_loop(all_padding):
    generator = torch.Generator().manual_seed(0)
    ids, mask = source_batch()
    if all_padding:
        mask[1] = False
    logits = torch.randn(2, 4, 40, generator=generator, dtype=torch.float64)
    query = torch.randn(2, 4, 8, generator=generator, dtype=torch.float64)
    source = torch.randn(2, 6, 8, generator=generator, dtype=torch.float64)
    gate = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    weights, context = copy_attention(query, source, mask)
    log_p = pointer_generator(logits, weights, ids, gate)
    torch.testing.assert_close(log_p, naive.pointer_generator(logits, query, source, mask, ids, gate))
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 4, dtype=torch.float64))
    assert torch.isfinite(log_p).all() and torch.isfinite(context).all()
    if not all_padding:
        assert (weights[1, :, 3:] == 0).all()  # padding gets no weight


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
    gate = head.gate(torch.cat([hidden, copy_attention(head.query(hidden), encoded, mask)[1]], -1)).squeeze(-1)
    expected = naive.pointer_generator(plain, head.query(hidden), encoded, mask, ids, gate)
    torch.testing.assert_close(out.logits.double(), expected, rtol=1e-5, atol=1e-5)
    # the source's padding changes nothing for the real tokens
    short = model(input_ids=ids[1:, :3], attention_mask=mask[1:, :3], decoder_input_ids=targets[1:])
    torch.testing.assert_close(short.logits, out.logits[1:], rtol=1e-5, atol=1e-5)
    # the same model without the copy head: its logits are the LM head's
    assert not torch.allclose(out.logits.log_softmax(-1), plain.log_softmax(-1), atol=1e-3)


def test_copy_is_off_by_default_and_saved_with_its_weights(build, model, tmp_path):
    if isinstance(model, FastformerForConditionalGeneration):
        assert build(FastformerForConditionalGeneration).copy_head is None
        assert model.config.copy_mechanism
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model)
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
    model.zero_grad()


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


@torch.no_grad()
def test_half_precision_copy_attention_sums_to_one(fastformer_model):
    ids, mask = source_batch()
    half = FastformerForConditionalGeneration(fastformer_model.config).to(torch.bfloat16).eval()
    half.load_state_dict(fastformer_model.state_dict())
    log_p = half(input_ids=ids, attention_mask=mask, decoder_input_ids=torch.tensor([[1, 5], [1, 8]])).logits
    assert log_p.dtype == torch.float32 and torch.isfinite(log_p).all()
    torch.testing.assert_close(log_p.exp().sum(-1), torch.ones(2, 2), rtol=0, atol=1e-5)
