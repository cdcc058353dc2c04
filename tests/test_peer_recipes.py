"""The recipes that work for GPT-2, BART and BERT, run on ours beside the peer: every keyword the peer's forward
accepts is honoured or refused with a clear message, never dropped in `**kwargs`. Each test runs the recipe on a
tiny random peer and on a tiny random Fastformer and compares logits, not just tokens."""

import functools
import inspect

import pytest
import torch
import transformers
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertModel,
    DataCollatorWithFlattening,
    DynamicCache,
    EncoderDecoderCache,
    GPT2Config,
    GPT2LMHeadModel,
)

from fastformer import (
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from fastformer.modeling_fastformer import FastformerTokenTypeEmbeddings

VOCAB = 99


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(tiny_config, vocab_size=VOCAB, decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)


def gpt2():
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    return GPT2LMHeadModel(config).eval()


def bart(**overrides):
    torch.manual_seed(0)
    config = BartConfig(
        **overrides,
        vocab_size=VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=37,
        decoder_ffn_dim=37,
        max_position_embeddings=64,
        pad_token_id=0,
        decoder_start_token_id=1,
    )
    return BartForConditionalGeneration(config).eval()


def bert(model_class=BertModel):
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37
    )
    return model_class(config).eval()


IDS = torch.randint(3, VOCAB, (2, 9), generator=torch.Generator().manual_seed(0))
SOURCE = torch.randint(3, VOCAB, (2, 11), generator=torch.Generator().manual_seed(1))

# each generative head beside its peer: the peer, ours, and the keyword arguments of a step after the prompt
GENERATIVE = {
    "causal": (gpt2, FastformerForCausalLM, {}),
    "seq2seq": (bart, FastformerForConditionalGeneration, {"input_ids": SOURCE}),
}


def step(model, extra, tokens, **kwargs):
    name = "decoder_input_ids" if "input_ids" in extra else "input_ids"
    return model(**extra, **{name: tokens}, **kwargs)


def continued_logits(model, extra, keyword):
    """The logits of IDS[:, 5:] after a cached prompt IDS[:, :5], its state passed as `keyword`."""
    prompt = step(model, extra, IDS[:, :5], use_cache=True)
    return step(model, extra, IDS[:, 5:], **{keyword: prompt.cache}).logits


# ---- every keyword of the peer's forward is one of ours ----------------------------------------------------------


@pytest.mark.parametrize(
    "ours, peer",
    [
        (FastformerModel, BertModel),
        (FastformerForMaskedLM, BertForMaskedLM),
        (FastformerForSequenceClassification, BertForSequenceClassification),
        (FastformerForCausalLM, GPT2LMHeadModel),
        (FastformerForConditionalGeneration, BartForConditionalGeneration),
    ],
    ids=lambda cls: cls.__name__,
)
def test_every_keyword_of_the_peer_is_a_parameter_of_ours_or_refused_by_the_one_check(build, ours, peer):
    """A keyword of the peer's forward is one of ours, or lands in `**kwargs`, where `checks.check_keywords` refuses
    a value ours cannot honour (a cross-attention's inputs, a cache given to an encoder); `use_cache` has no effect
    on an encoder, as on BERT's."""

    def keywords(model_class):
        parameters = inspect.signature(model_class.forward).parameters.values()
        return {p.name for p in parameters if p.kind is not p.VAR_KEYWORD} - {"self"}

    values = {
        "encoder_hidden_states": torch.randn(2, 4, 32),
        "encoder_attention_mask": torch.ones(2, 4, dtype=torch.long),
        "cache": DynamicCache(),
    }
    missing = keywords(peer) - keywords(ours)
    assert missing <= {*values, "use_cache"}
    for name in missing - {"use_cache"}:
        with pytest.raises(ValueError, match="cross-attention|generation state"):
            build(ours)(IDS, **{name: values[name]})


# ---- the state carried both ways: `cache=` and transformers' former `past_key_values=` ---------------------------


@pytest.mark.parametrize("head", GENERATIVE)
@pytest.mark.parametrize("keyword", ["cache", "past_key_values"])
def test_the_state_continues_under_either_name_as_in_the_peer(build, head, keyword):
    peer_class, ours_class, extra = GENERATIVE[head]
    for model in (peer_class(), build(ours_class)):
        whole = step(model, extra, IDS).logits[:, 5:]
        continued = continued_logits(model, extra, keyword)
        torch.testing.assert_close(continued, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", GENERATIVE)
def test_cache_params_is_mapped_to_the_cache_as_mamba_does(build, head):
    _, ours_class, extra = GENERATIVE[head]
    model = build(ours_class)
    whole = step(model, extra, IDS).logits[:, 5:]
    continued = continued_logits(model, extra, "cache_params")
    torch.testing.assert_close(continued, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", GENERATIVE)
@pytest.mark.parametrize("how", ["use_cache=False", "config.use_cache=False", "labels"])
def test_a_given_cache_is_read_whatever_use_cache_says(build, head, how):
    """Scoring a continuation after a cached prompt: the peer reads the cache it is given with use_cache off, and
    with labels (which turn use_cache off in BART)."""
    peer_class, ours_class, extra = GENERATIVE[head]
    for model in (peer_class(), build(ours_class)):
        whole = step(model, extra, IDS)
        prompt = step(model, extra, IDS[:, :5], use_cache=True)
        kwargs = {"cache": prompt.cache}
        if how == "use_cache=False":
            kwargs["use_cache"] = False
        elif how == "labels":
            kwargs["labels"] = IDS[:, 5:].contiguous()  # BART flattens them with view
        else:
            model.config.use_cache = False
        continued = step(model, extra, IDS[:, 5:], **kwargs)
        torch.testing.assert_close(continued.logits, whole.logits[:, 5:], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", GENERATIVE)
def test_an_empty_transformers_cache_starts_generation_as_in_the_peer(build, head):
    """generate(past_key_values=DynamicCache()) (BART: an empty `EncoderDecoderCache`), as the peers take it."""
    peer_class, ours_class, extra = GENERATIVE[head]
    prompt = extra or {"input_ids": IDS[:, :5]}
    for model in (peer_class(), build(ours_class)):
        empty = DynamicCache() if head == "causal" else EncoderDecoderCache(DynamicCache(), DynamicCache())
        given = model.generate(**prompt, past_key_values=empty, max_new_tokens=4, do_sample=False)
        torch.testing.assert_close(given, model.generate(**prompt, max_new_tokens=4, do_sample=False))


def test_barts_empty_cache_carries_the_state_from_call_to_call(build):
    """BART's loop: one `EncoderDecoderCache(DynamicCache(), DynamicCache())` passed to every forward; the
    decoder's state takes the place of its empty self-attention part."""
    for model in (bart(), build(FastformerForConditionalGeneration)):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        step(model, {"input_ids": SOURCE}, IDS[:, :5], cache=cache, use_cache=True)
        continued = step(model, {"input_ids": SOURCE}, IDS[:, 5:], cache=cache, use_cache=True).logits
        whole = step(model, {"input_ids": SOURCE}, IDS).logits[:, 5:]
        torch.testing.assert_close(continued, whole, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("head", GENERATIVE)
def test_an_empty_dynamic_cache_in_forward_is_filled_as_gpt2s_and_barts(build, head):
    """GPT-2 and BART fill the empty `DynamicCache()` (BART: in an `EncoderDecoderCache`) they are given; so does
    Fastformer, with its own cache layers, and the next token continues from it as from one pass."""
    _, ours_class, extra = GENERATIVE[head]
    model = build(ours_class)
    cache = DynamicCache() if head == "causal" else EncoderDecoderCache(DynamicCache(), DynamicCache())
    step(model, extra, IDS[:, :5], cache=cache, use_cache=True)
    states = cache if head == "causal" else cache.self_attention_cache
    assert len(states.layers) == model.config.num_decoder_layers and cache.get_seq_length() == 5
    continued = step(model, extra, IDS[:, 5:6], cache=cache, use_cache=True).logits[:, -1]
    torch.testing.assert_close(continued, step(model, extra, IDS[:, :6]).logits[:, -1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("head", GENERATIVE)
def test_a_cache_of_keys_and_values_is_refused_clearly(build, head):
    """A `DynamicCache` holding keys and values (what PEFT's prefix tuning passes) has nothing a recurrent state can
    continue from."""
    _, ours_class, extra = GENERATIVE[head]
    keys_values = DynamicCache()
    keys_values.update(torch.zeros(2, 4, 3, 8), torch.zeros(2, 4, 3, 8), 0)
    cache = keys_values if head == "causal" else EncoderDecoderCache(keys_values, DynamicCache())
    with pytest.raises(ValueError, match="keys and values.*prefix tuning"):
        step(build(ours_class), extra, IDS, cache=cache)


@pytest.mark.parametrize("head", GENERATIVE)
def test_peft_prefix_tuning_is_refused_clearly(build, head):
    peft = pytest.importorskip("peft")
    _, ours_class, extra = GENERATIVE[head]
    task = "CAUSAL_LM" if head == "causal" else "SEQ_2_SEQ_LM"
    model = peft.get_peft_model(build(ours_class), peft.PrefixTuningConfig(task_type=task, num_virtual_tokens=4))
    with pytest.raises(ValueError, match="prefix tuning"):
        step(model, extra, IDS, attention_mask=torch.ones(2, 9, dtype=torch.long), labels=IDS)


@pytest.mark.parametrize("head", GENERATIVE)
def test_prepare_inputs_for_generation_keeps_a_cache_passed_as_past_key_values(build, head):
    _, ours_class, extra = GENERATIVE[head]
    model = build(ours_class)
    cache = step(model, extra, IDS[:, :5], use_cache=True).cache
    inputs = model.prepare_inputs_for_generation(IDS[:, :6], past_key_values=cache)
    assert inputs["cache"] is cache


# ---- keywords a Fastformer head cannot honour are refused ---------------------------------------------------------


def test_the_causal_lm_refuses_encoder_states_as_gpt2_does(build):
    states = torch.randn(2, 4, 32)
    with pytest.raises(ValueError, match="cross-attention"):
        gpt2()(IDS, encoder_hidden_states=states)
    with pytest.raises(ValueError, match="cross-attention"):
        build(FastformerForCausalLM)(IDS, encoder_hidden_states=states)


def learned_segments(model):
    """`model` with the token-type rows past 0 drawn as BERT's start: the table starts at zero and is learned
    (tests/test_modeling.py), and a second segment moves the outputs of a model that has learned it."""
    table = next(module for module in model.modules() if isinstance(module, FastformerTokenTypeEmbeddings))
    with torch.no_grad():
        table.weight[1:].normal_(std=model.config.initializer_range)
    return model


# a text pair as BERT's tokenizer encodes it: the second text is segment 1
SEGMENTS = torch.cat([torch.zeros(2, 5, dtype=torch.long), torch.ones(2, IDS.shape[1] - 5, dtype=torch.long)], dim=1)
# each head beside the peer that reads `token_type_ids`, and the output compared
SEGMENT_PEERS = {
    FastformerModel: (bert, "last_hidden_state"),
    FastformerForSequenceClassification: (functools.partial(bert, BertForSequenceClassification), "logits"),
    FastformerForMaskedLM: (functools.partial(bert, BertForMaskedLM), "logits"),
    FastformerForCausalLM: (gpt2, "logits"),
}


@pytest.mark.parametrize("model_class", list(SEGMENT_PEERS), ids=lambda model_class: model_class.__name__)
def test_a_second_segment_moves_the_outputs_as_it_moves_the_peers(build, model_class):
    """BERT (and GPT-2) read `token_type_ids`: a text pair's second segment moves the outputs from those of one
    segment (all zeros); a causal model's only from the second segment's first token on. All zeros read as none, as
    in BERT (not in GPT-2, whose token types are token embeddings: type 0 is token 0's). Fastformer's table starts at
    zero and is learned (tests/test_modeling.py): here it is drawn as BERT's starts (`learned_segments`)."""
    peer, name = SEGMENT_PEERS[model_class]
    first_moved = 5 if model_class is FastformerForCausalLM else 0
    for model in (peer(), learned_segments(build(model_class))):
        with torch.no_grad():
            alone = model(IDS)[name]
            one_segment = model(IDS, token_type_ids=torch.zeros_like(IDS))[name]
            pair = model(IDS, token_type_ids=SEGMENTS)[name]
        torch.testing.assert_close(pair[:, :first_moved], one_segment[:, :first_moved], rtol=0, atol=1e-6)
        moved = float((pair - one_segment)[:, first_moved:].abs().amax())
        assert moved > 1e-5, f"{type(model).__name__}: a second segment moves the outputs by {moved}"
        if model.config.model_type != "gpt2":
            assert torch.equal(one_segment, alone), type(model).__name__


def test_generate_continues_the_last_token_type_as_for_gpt2(build):
    """generate() gives every new token the prompt's last token type and passes each step its own columns: the
    logits of every step are those of one forward over the whole sequence with the types so extended."""
    for model in (gpt2(), learned_segments(build(FastformerForCausalLM))):
        out = model.generate(
            IDS,
            token_type_ids=SEGMENTS,
            max_new_tokens=3,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        new_tokens = out.sequences.shape[1] - IDS.shape[1]
        types = torch.cat([SEGMENTS, SEGMENTS[:, -1:].expand(-1, new_tokens)], dim=1)
        with torch.no_grad():
            whole = model(out.sequences, token_type_ids=types).logits
        steps = torch.stack(out.logits, dim=1)
        torch.testing.assert_close(steps, whole[:, IDS.shape[1] - 1 : -1], rtol=0, atol=1e-5)


@pytest.mark.parametrize("model_class", [FastformerModel, FastformerForMaskedLM, FastformerForSequenceClassification])
@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"encoder_hidden_states": torch.randn(2, 4, 32)}, "cross-attention"),
        ({"cache": DynamicCache()}, "generation state"),
        ({"past_key_values": DynamicCache()}, "generation state"),
        ({"is_causal": True}, "bidirectional"),
        ({"cu_seq_lens_q": torch.tensor([0, 9, 18])}, "position_ids"),
    ],
    ids=["encoder_hidden_states", "cache", "past_key_values", "is_causal", "flash-packing"],
)
def test_the_encoder_refuses_what_it_cannot_honour(build, model_class, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(model_class)(IDS, **kwargs)


def test_the_encoder_takes_what_bert_takes_and_changes_nothing(build):
    model = build(FastformerModel)
    expected = model(IDS).last_hidden_state
    for kwargs in ({"use_cache": True}, {"use_cache": False}, {"is_causal": False}, {"encoder_hidden_states": None}):
        torch.testing.assert_close(model(IDS, **kwargs).last_hidden_state, expected)


def test_the_encoder_decoder_takes_position_ids_as_the_encoders(build):
    model = build(FastformerForConditionalGeneration)
    positions = torch.arange(3, 3 + SOURCE.shape[1]).expand(2, -1)
    decoder_ids = IDS[:, :4]
    encoder_states = model.get_encoder()(SOURCE, position_ids=positions).last_hidden_state
    given = model(SOURCE, decoder_input_ids=decoder_ids, position_ids=positions)
    torch.testing.assert_close(given.encoder_last_hidden_state, encoder_states)
    assert not torch.allclose(given.logits, model(SOURCE, decoder_input_ids=decoder_ids).logits)


# ---- the attention mask: any non-zero value is a token, as in BERT, GPT-2 and BART ---------------------------------


@pytest.mark.parametrize("model_class", [FastformerModel, FastformerForCausalLM, FastformerForConditionalGeneration])
def test_a_mask_of_zeros_and_twos_is_a_mask_of_zeros_and_ones(build, model_class):
    model = build(model_class)
    mask = torch.ones_like(IDS)
    mask[0, :3] = 0
    source = {"decoder_input_ids": IDS[:, :4]} if model_class is FastformerForConditionalGeneration else {}
    ones = model(IDS, attention_mask=mask, **source)[0]
    twos = model(IDS, attention_mask=2 * mask, **source)[0]
    torch.testing.assert_close(twos, ones)
    peer = bert()
    torch.testing.assert_close(
        peer(IDS, attention_mask=2 * mask).last_hidden_state, peer(IDS, attention_mask=mask).last_hidden_state
    )


# ---- packed rows (DataCollatorWithFlattening): the sequences stay apart, as in BERT -------------------------------

LENGTHS = (5, 9, 3)
MODES = ("auto", "plain", "collapsed")  # the encoder's set_additive_attention_mode


def packed_batch():
    generator = torch.Generator().manual_seed(2)
    features = [{"input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist()} for n in LENGTHS]
    return features, DataCollatorWithFlattening(return_tensors="pt")(features)


PACKED_MODELS = [
    *((model_class, mode) for model_class in (FastformerModel, FastformerForMaskedLM) for mode in MODES),
    (BertModel, None),
    (BertForMaskedLM, None),
]


@pytest.mark.parametrize(
    "model_class, mode", PACKED_MODELS, ids=[f"{cls.__name__}-{mode}" for cls, mode in PACKED_MODELS]
)
def test_packed_rows_give_each_sequence_alone(build, model_class, mode):
    if mode is None:
        model = bert(model_class)
    else:
        model = build(model_class)
        model.set_additive_attention_mode(mode)
    features, packed = packed_batch()
    assert packed["input_ids"].shape == (1, sum(LENGTHS))
    together = model(input_ids=packed["input_ids"], position_ids=packed["position_ids"])[0][0]
    alone = torch.cat([model(torch.tensor([feature["input_ids"]]))[0][0] for feature in features])
    torch.testing.assert_close(together, alone, atol=1e-5, rtol=1e-4)


def test_packed_rows_are_refused_where_a_row_gets_one_prediction(build):
    _, packed = packed_batch()
    with pytest.raises(ValueError, match="packed"):
        build(FastformerForSequenceClassification)(input_ids=packed["input_ids"], position_ids=packed["position_ids"])


@pytest.mark.parametrize(
    "model_class, kernel",
    [(FastformerForCausalLM, 0), (FastformerForCausalLM, 3), (GPT2LMHeadModel, None)],
    ids=["FastformerForCausalLM", "FastformerForCausalLM-short-convolution", "GPT2LMHeadModel"],
)
def test_packed_rows_give_each_sequence_alone_in_the_causal_lm(build, model_class, kernel):
    """Padding-free training (DataCollatorWithFlattening, TRL's padding_free): the logits and the loss of packed
    rows are those of the sequences alone (with the short convolution too, which reads the tokens before each)."""
    if model_class is GPT2LMHeadModel:
        model = gpt2()
    else:  # a convolution wide enough that a sequence reading the one before it would show
        model = build(model_class, decoder_conv_kernel=kernel, initializer_range=0.2)
    features, packed = packed_batch()
    together = model(**packed, use_cache=False)
    alone = [model(torch.tensor([feature["input_ids"]]), use_cache=False).logits[0] for feature in features]
    torch.testing.assert_close(together.logits[0], torch.cat(alone), atol=1e-5, rtol=1e-4)
    predicted = torch.cat([logits[:-1] for logits in alone])  # no sequence predicts the next one's first token
    targets = torch.cat([torch.tensor(feature["input_ids"][1:]) for feature in features])
    torch.testing.assert_close(together.loss, torch.nn.functional.cross_entropy(predicted, targets))


@pytest.mark.parametrize(
    "head, kwargs, message",
    [
        ("causal", {"use_cache": False, "output_attentions": True}, "output_attentions"),
        ("seq2seq", {"use_cache": False}, "cross-attention"),
    ],
    ids=["attentions", "cross-attention"],
)
def test_packed_rows_are_refused_where_the_decoder_cannot_take_them_apart(build, head, kwargs, message):
    _, ours_class, extra = GENERATIVE[head]
    _, packed = packed_batch()
    name = "decoder_input_ids" if extra else "input_ids"
    positions = "decoder_position_ids" if extra else "position_ids"
    with pytest.raises(ValueError, match=f"packed.*{message}"):
        build(ours_class)(**extra, **{name: packed["input_ids"], positions: packed["position_ids"]}, **kwargs)


def test_packed_source_rows_are_refused_by_the_encoder_decoder(build):
    _, packed = packed_batch()
    model = build(FastformerForConditionalGeneration)
    with pytest.raises(ValueError, match="source rows are packed"):
        model(input_ids=packed["input_ids"], position_ids=packed["position_ids"], decoder_input_ids=IDS[:1, :3])


# ---- caches in the recipes users run: training, inference mode, chunked prefill, resized vocabularies ------------


@pytest.mark.parametrize("head", GENERATIVE)
def test_checkpointed_training_refuses_a_prefix_cache_and_drops_use_cache_as_the_peer(build, head, caplog):
    """Under gradient checkpointing GPT-2 and BART set `use_cache=False` with a warning, and fail on a cache holding
    a prefix; Fastformer does the same, with an error that names the way out (the layers are recomputed, and the
    state cannot be read twice)."""
    peer_class, ours_class, extra = GENERATIVE[head]
    for model in (peer_class(), build(ours_class)):
        with torch.no_grad():
            prefix = step(model, extra, IDS[:, :4], use_cache=True).cache
        model.train()
        model.gradient_checkpointing_enable()
        transformers.utils.logging.warning_once.cache_clear()  # each model's warning, not only the first one's
        with caplog.at_level("WARNING", logger="transformers"):
            assert step(model, extra, IDS, use_cache=True).cache is None
        assert "Setting `use_cache=False`" in caplog.text
        caplog.clear()
        error = ValueError if isinstance(model, ours_class) else RuntimeError
        with pytest.raises(error, match="gradient_checkpointing_disable" if error is ValueError else None):
            step(model, extra, IDS[:, 4:], cache=prefix, labels=IDS[:, 4:])


@pytest.mark.parametrize("head", GENERATIVE)
def test_a_cache_made_in_inference_mode_continues_outside_it_as_the_peers(build, head):
    peer_class, ours_class, extra = GENERATIVE[head]
    for model in (peer_class(), build(ours_class)):
        with torch.inference_mode():
            cache = step(model, extra, IDS[:, :5], use_cache=True).cache
        with torch.no_grad():
            continued = step(model, extra, IDS[:, 5:], cache=cache).logits
            whole = step(model, extra, IDS).logits[:, 5:]
        torch.testing.assert_close(continued, whole, rtol=1e-5, atol=1e-5)
    cache.reset()  # ours can be used again, as generate() resets a static cache
    with torch.no_grad():
        again = step(model, extra, IDS, cache=cache, use_cache=True).logits[:, 5:]
    torch.testing.assert_close(again, whole, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kernel", [0, 3], ids=["plain", "short-convolution"])
def test_chunked_prefill_generates_as_gpt2_does(build, kernel):
    """generate(prefill_chunk_size=...) reads the prompt in chunks through the cache: the logits of one prefill."""
    mask = torch.ones_like(IDS)
    mask[1, :3] = 0  # a left-padded row
    for model in (gpt2(), build(FastformerForCausalLM, decoder_conv_kernel=kernel)):
        outputs = [
            model.generate(
                IDS,
                attention_mask=mask,
                max_new_tokens=4,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
                **chunks,
            )
            for chunks in ({}, {"prefill_chunk_size": 4})
        ]
        torch.testing.assert_close(torch.stack(outputs[1].logits), torch.stack(outputs[0].logits), rtol=1e-5, atol=1e-5)
        assert torch.equal(outputs[1].sequences, outputs[0].sequences)


@pytest.mark.parametrize("untied", ["tie_word_embeddings", "tie_encoder_embeddings"])
def test_resized_vocabulary_reaches_an_untied_decoder_as_barts(build, tmp_path, untied):
    """`resize_token_embeddings` on an encoder-decoder whose decoder has word embeddings of its own resizes them too
    (BART's share one matrix): a new token id runs through both sides, and the model reloads with its outputs (BART
    with `tie_word_embeddings=False` does not: transformers 5.25 reloads it without its embeddings)."""
    new_id = VOCAB + 2
    source, decoder_ids = torch.tensor([[new_id, 5, 6]]), torch.tensor([[1, new_id, 7]])
    for model in (bart(tie_word_embeddings=False), build(FastformerForConditionalGeneration, **{untied: False})):
        model.resize_token_embeddings(VOCAB + 5)
        with torch.no_grad():
            logits = model(source, decoder_input_ids=decoder_ids).logits
        assert logits.shape == (1, 3, VOCAB + 5)
    model.save_pretrained(tmp_path)
    reloaded = FastformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(source, decoder_input_ids=decoder_ids).logits, logits)


def test_a_left_padded_turn_after_the_cache_continues_as_without_its_padding(build):
    """A chat turn's new tokens left-padded after the cached ones (holes inside the mask): with the decoder's short
    convolution, as without it and as GPT-2, the real tokens get the logits of the conversation without the holes."""
    for model in (gpt2(), build(FastformerForCausalLM, decoder_conv_kernel=4, share_layers=False)):
        prompt, turn = IDS[:, :5], IDS[:, 5:]
        whole = step(model, {}, IDS).logits[:, 5:]
        cache = step(model, {}, prompt, use_cache=True).cache
        padded = torch.cat((torch.zeros(2, 2, dtype=torch.long), turn), dim=1)
        mask = torch.cat((torch.ones(2, 5), torch.zeros(2, 2), torch.ones_like(turn)), dim=1).long()
        positions = torch.arange(5, 9).expand(2, -1)
        positions = torch.cat((torch.ones(2, 2, dtype=torch.long), positions), dim=1)
        with torch.no_grad():
            continued = model(padded, attention_mask=mask, position_ids=positions, cache=cache).logits[:, 2:]
        torch.testing.assert_close(continued, whole, rtol=1e-5, atol=1e-5)
