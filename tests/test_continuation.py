"""Continuing generation from the cache generate() returned (chat turns, streaming): the logits of one-shot
generation, as GPT-2 and BART give them, in every form transformers' recipe allows; other forms are refused."""

import functools

import pytest
import torch
from transformers import BartConfig, BartForConditionalGeneration, GPT2Config, GPT2LMHeadModel

from fastformer import FastformerForCausalLM, FastformerForConditionalGeneration

VOCAB, PAD, START, EOS = 61, 0, 1, 2
MODELS = [FastformerForCausalLM, FastformerForConditionalGeneration]


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(
        tiny_config,
        vocab_size=VOCAB,
        intermediate_size=48,
        num_decoder_layers=3,
        initializer_range=0.2,
        pad_token_id=PAD,
        bos_token_id=START,
        decoder_start_token_id=START,
        eos_token_id=EOS,
    )


def peer(model_class):
    """A tiny random GPT-2 or BART, the peer of `model_class`."""
    torch.manual_seed(0)
    special = dict(vocab_size=VOCAB, pad_token_id=PAD, bos_token_id=START, eos_token_id=EOS)
    if model_class is FastformerForCausalLM:
        config = GPT2Config(n_embd=32, n_layer=2, n_head=4, initializer_range=0.2, **special)
        return GPT2LMHeadModel(config).eval()
    config = BartConfig(
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=48,
        decoder_ffn_dim=48,
        init_std=0.2,
        decoder_start_token_id=START,
        forced_eos_token_id=None,
        **special,
    )
    return BartForConditionalGeneration(config).eval()


def left_padded_batch():
    """Two rows, the second left-padded: a causal LM's prompt, or a seq2seq model's source."""
    ids = torch.randint(3, VOCAB, (2, 6), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2], ids[1, :2] = 0, PAD
    return ids, mask


def generate(model, ids, mask, sequences=None, sequences_mask=None, **kwargs):
    """generate() on the prompt (causal LM) or the source (seq2seq); `sequences`: what the causal LM continues,
    or the seq2seq model's decoder input so far."""
    kwargs = dict(do_sample=False, eos_token_id=None, return_dict_in_generate=True, output_logits=True, **kwargs)
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            if sequences is not None:
                kwargs.update(decoder_input_ids=sequences, decoder_attention_mask=sequences_mask)
            return model.generate(ids, attention_mask=mask, **kwargs)
        if sequences is None:
            return model.generate(ids, attention_mask=mask, **kwargs)
        return model.generate(sequences, attention_mask=sequences_mask, **kwargs)


def logits(output):
    return torch.stack(output.logits, dim=1)


def sequences_mask(model, mask, sequences):
    """The attention mask of `sequences`: the prompt's padding stays padding (causal LM); a seq2seq decoder
    input has none."""
    full = torch.ones_like(sequences)
    if not model.config.is_encoder_decoder:
        full[:, : mask.shape[1]] = mask
    return full


# (model, form, whether the peer gets it right): the recipe's forms, the whole sequence with or without its mask,
# or (causal LM) only the tokens the cache has not read with a mask of all; BART re-reads the whole decoder input
# without a decoder mask, transformers 5.24 trims it only when a mask is given
FORMS = [
    (FastformerForCausalLM, "whole-sequence-and-mask", True),
    (FastformerForCausalLM, "new-tokens-and-full-mask", True),
    (FastformerForConditionalGeneration, "whole-sequence-and-mask", True),
    (FastformerForConditionalGeneration, "whole-sequence", False),
]


@pytest.mark.parametrize("model_class, form, peer_too", FORMS, ids=lambda v: getattr(v, "__name__", str(v)))
def test_continuing_from_the_returned_cache_gives_the_logits_of_one_shot_generation(build, model_class, form, peer_too):
    ids, mask = left_padded_batch()
    for model in (peer(model_class), build(model_class)) if peer_too else (build(model_class),):
        one_shot = generate(model, ids, mask, max_new_tokens=8)
        first = generate(model, ids, mask, max_new_tokens=4)
        sequences, full_mask = first.sequences, sequences_mask(model, mask, first.sequences)
        if form == "new-tokens-and-full-mask":
            sequences = sequences[:, -1:]  # the one token the cache has not read: the last generated
        if form == "whole-sequence":
            full_mask = None
        continued = generate(model, ids, mask, sequences, full_mask, max_new_tokens=4, cache=first.cache)
        torch.testing.assert_close(logits(continued), logits(one_shot)[:, 4:], rtol=1e-5, atol=1e-5)
        assert torch.equal(continued.sequences[:, -4:], one_shot.sequences[:, -4:])


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("settings", [dict(), dict(num_beams=3)], ids=["greedy", "beam"])
def test_a_new_turn_after_the_cache_decodes_as_without_the_cache(build, model_class, settings):
    """A chat turn: the returned sequences, then new tokens of the user's, continued from the cache in greedy
    search or beam search, give the logits of generating from the same tokens without any cache."""
    model = build(model_class)
    ids, mask = left_padded_batch()
    first = generate(model, ids, mask, max_new_tokens=4)
    turn = torch.cat([first.sequences, torch.randint(3, VOCAB, (2, 3), generator=torch.Generator().manual_seed(2))], 1)
    turn_mask = sequences_mask(model, mask, turn)
    continued = generate(model, ids, mask, turn, turn_mask, max_new_tokens=4, cache=first.cache, **settings)
    fresh = generate(model, ids, mask, turn, turn_mask, max_new_tokens=4, **settings)
    torch.testing.assert_close(logits(continued), logits(fresh), rtol=1e-5, atol=1e-5)
    assert torch.equal(continued.sequences, fresh.sequences)


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_forms_that_cannot_continue_are_refused_with_the_form_to_use(build, model_class):
    model = build(model_class)
    ids, mask = left_padded_batch()
    first = generate(model, ids, mask, max_new_tokens=4)
    if model.config.is_encoder_decoder:
        # generate() puts the start token before new tokens alone: they would follow a second start token
        new_tokens, width, message = first.sequences[:, -1:], 5, "`decoder_input_ids` has 2 and its attention mask 6"
    else:  # new tokens only, but a mask of the new tokens only: the cached ones would be lost
        new_tokens, width, message = first.sequences[:, -1:], 1, "`input_ids` has 1 and its attention mask 1"
    with pytest.raises(ValueError, match=f"{message}: pass the whole sequence"):
        generate(
            model, ids, mask, new_tokens, torch.ones(2, width, dtype=torch.long), max_new_tokens=2, cache=first.cache
        )
    beams = generate(model, ids, mask, max_new_tokens=4, num_beams=3)
    with pytest.raises(ValueError, match="comes from beam search"):
        generate(
            model,
            ids,
            mask,
            beams.sequences,
            sequences_mask(model, mask, beams.sequences),
            max_new_tokens=2,
            cache=beams.cache,
        )
