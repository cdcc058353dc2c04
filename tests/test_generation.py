"""FastformerForConditionalGeneration and FastformerForCausalLM: causality, incremental decoding, generate()."""

import functools

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from benchmarks.decoding import cache_nbytes
from export_seq2seq_onnx import state_tensors
from fastformer import (
    FastformerCacheLayer,
    FastformerCopyConfig,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
)
from fastformer.modeling_fastformer import FastformerCrossAttention
from tests.conftest import empty_cache

VOCAB, PAD, START, EOS = 61, 0, 1, 2

VARIANTS = {
    "paper": {},
    "unshared-softmax-cross": dict(share_layers=False, share_query_value=False),
    "additive-cross-concat": dict(share_layers=False, cross_attention_type="additive", interaction="concat"),
    "short-convolution": dict(share_layers=False, decoder_conv_kernel=3),
}


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(
        tiny_config,
        vocab_size=VOCAB,
        intermediate_size=48,
        num_decoder_layers=3,
        max_position_embeddings=600,
        initializer_range=0.2,  # wide enough that greedy decoding does not repeat one token
        pad_token_id=PAD,
        bos_token_id=START,
        decoder_start_token_id=START,
        eos_token_id=EOS,
    )


def tokens(*shape, seed=1):
    return torch.randint(3, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def logits(model, ids, mask=None, **kwargs):
    """Decoder logits for decoder input `ids` (and a fixed source for the seq2seq model)."""
    with torch.no_grad():
        if isinstance(model, FastformerForConditionalGeneration):
            source = tokens(ids.shape[0], 9, seed=7)
            return model(source, decoder_input_ids=ids, decoder_attention_mask=mask, **kwargs).logits
        return model(ids, attention_mask=mask, **kwargs).logits


MODELS = [FastformerForConditionalGeneration, FastformerForCausalLM]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_no_future_leak(build, model_class, variant):
    model = build(model_class, **VARIANTS[variant])
    ids = tokens(2, 10)
    reference = logits(model, ids, use_cache=False)
    for t in [0, 4, 8]:
        changed = ids.clone()
        changed[:, t + 1 :] = tokens(2, 9 - t, seed=t + 11)
        torch.testing.assert_close(logits(model, changed, use_cache=False)[:, : t + 1], reference[:, : t + 1])
    assert not torch.allclose(logits(model, changed, use_cache=False), reference)


@pytest.mark.parametrize("pieces", [[1] * 10, [3, 1, 4, 2]], ids=["token-by-token", "chunks-3-1-4-2"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_incremental_decoding_equals_full_forward(build, model_class, variant, pieces):
    model = build(model_class, **VARIANTS[variant])
    ids = tokens(2, 10)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding in row 1
    full = logits(model, ids, mask, use_cache=False)
    cache, steps, start = empty_cache(model), [], 0
    for length in pieces:
        # generate() style: the mask covers every token so far, the ids only the new ones
        steps.append(logits(model, ids[:, start : start + length], mask[:, : start + length], cache=cache))
        start += length
    assert cache.get_seq_length() == 10
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5)


def generate(model, inputs, mask=None, **kwargs):
    with torch.no_grad():
        return model.generate(inputs, attention_mask=mask, return_dict_in_generate=True, output_scores=True, **kwargs)


@pytest.mark.parametrize(
    "settings",
    [dict(), dict(num_beams=3), dict(num_beams=3, num_return_sequences=2)],
    ids=["greedy", "beam", "beam-return-2"],
)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_generate_with_cache_equals_without(build, model_class, variant, settings):
    model = build(model_class, **VARIANTS[variant])
    inputs = tokens(2, 7)
    mask = torch.ones_like(inputs)
    mask[0, :2] = 0
    cached = generate(model, inputs, mask, max_new_tokens=12, use_cache=True, **settings)
    uncached = generate(model, inputs, mask, max_new_tokens=12, use_cache=False, **settings)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert not torch.allclose(cached.scores[1], cached.scores[-1])  # the state evolves from step to step
    for step_cached, step_uncached in zip(cached.scores, uncached.scores):
        torch.testing.assert_close(step_cached, step_uncached, rtol=1e-4, atol=1e-4)
    if "num_beams" in settings:
        torch.testing.assert_close(cached.sequences_scores, uncached.sequences_scores, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_sampling_with_cache_equals_without(build, model_class):
    model = build(model_class)
    inputs = tokens(2, 7)
    runs = []
    for use_cache in [True, False]:
        torch.manual_seed(5)
        runs.append(
            generate(
                model, inputs, max_new_tokens=10, do_sample=True, top_k=10, num_return_sequences=3, use_cache=use_cache
            ).sequences
        )
    assert runs[0].shape[0] == 6 and torch.equal(runs[0], runs[1])


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_generate_fills_a_cache_the_user_made_and_reset_empties_it(build, model_class):
    """As for transformers' other linear-attention models: generate(cache=...) fills the cache given (for the
    encoder-decoder the source's keys and values too), and `reset()` makes it reusable."""
    model = build(model_class, share_layers=False)
    inputs = tokens(2, 7)
    expected = generate(model, inputs, max_new_tokens=10).sequences
    cache = empty_cache(model)
    first = generate(model, inputs, max_new_tokens=6, cache=cache).sequences
    assert torch.equal(first, expected[:, : first.shape[1]]) and cache.get_seq_length() > 0
    if model.config.is_encoder_decoder:
        assert all(cache.is_updated.values()) and len(cache.is_updated) == model.config.num_decoder_layers
    cache.reset()
    assert cache.get_seq_length() == 0
    assert torch.equal(generate(model, inputs, max_new_tokens=10, cache=cache).sequences, expected)


@pytest.mark.parametrize("kernel", [0, 3], ids=["plain", "short-convolution"])
def test_decoding_steps_update_the_state_in_place_and_a_reset_cache_takes_another_batch_size(build, kernel):
    """Steps without gradients copy the new state into the cache's tensors (with the short convolution, its last
    inputs too), as transformers' linear-attention layers copy into theirs: the addresses that CUDA graphs (a
    compiled step, mode="reduce-overhead") replay stay. `reset()` zeroes them, as transformers' layers."""
    model = build(FastformerForCausalLM, decoder_conv_kernel=kernel)
    cache = empty_cache(model)
    logits(model, tokens(4, 5), cache=cache)
    earlier = state_tensors(cache)
    copies = [tensor.clone() for tensor in earlier]
    for step in range(2):
        logits(model, tokens(4, 1, seed=2 + step), cache=cache)
    now = state_tensors(cache)
    assert all(tensor is kept for tensor, kept in zip(now, earlier, strict=True))
    assert not any(torch.equal(tensor, copy) for tensor, copy in zip(now, copies))  # moved on
    cache.reset()
    after = state_tensors(cache)
    assert cache.get_seq_length() == 0 and len(after) == len(earlier)
    assert all(tensor is kept and not tensor.any() for tensor, kept in zip(after, earlier))
    one = tokens(1, 5, seed=3)
    torch.testing.assert_close(logits(model, one, cache=cache), logits(model, one, use_cache=False))


def test_backward_through_several_cached_steps(build):
    """Training through the recurrent state across calls (e.g. truncated backpropagation through time)."""
    model = build(FastformerForCausalLM).train()
    cache = empty_cache(model)
    loss = sum(model(tokens(2, 3, seed=step), cache=cache, use_cache=True).logits.sum() for step in range(3))
    loss.backward()
    assert all(p.grad is not None for name, p in model.named_parameters() if "layers" in name and "weight" in name)


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_checkpointed_training_keeps_no_cache(build, model_class):
    """Checkpointed layers run without the cache: a forward with use_cache=True returns none instead of one that
    counted tokens but holds no state."""
    model = build(model_class).train()
    model.activation_checkpointing_enable()
    ids = tokens(2, 5)
    if model_class is FastformerForConditionalGeneration:
        output = model(tokens(2, 4, seed=3), decoder_input_ids=ids, use_cache=True)
    else:
        output = model(ids, use_cache=True)
    assert output.cache is None
    if model_class is FastformerForCausalLM:
        with torch.no_grad():  # without gradients nothing is checkpointed: generation keeps its cache
            assert model(ids, use_cache=True).cache is not None


@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_padded_sources_generate_as_single_runs(build, variant, side):
    model = build(FastformerForConditionalGeneration, **VARIANTS[variant])
    sources = [tokens(n, seed=n) for n in (4, 9, 6)]
    batch = torch.full((3, 9), PAD)
    mask = torch.zeros_like(batch)
    for row, source in enumerate(sources):
        span = slice(9 - len(source), 9) if side == "left" else slice(0, len(source))
        batch[row, span], mask[row, span] = source, 1
    settings = dict(max_new_tokens=10, min_new_tokens=10)
    together = generate(model, batch, mask, **settings).sequences
    for row, source in enumerate(sources):
        assert torch.equal(together[row], generate(model, source[None], **settings).sequences[0])


@pytest.mark.parametrize("variant", VARIANTS)
def test_left_padded_prompts_generate_as_single_runs(build, variant):
    model = build(FastformerForCausalLM, **VARIANTS[variant])
    prompts = [tokens(n, seed=n) for n in (3, 8, 5)]
    batch = torch.full((3, 8), PAD)
    mask = torch.zeros_like(batch)
    for row, prompt in enumerate(prompts):
        batch[row, 8 - len(prompt) :], mask[row, 8 - len(prompt) :] = prompt, 1
    settings = dict(max_new_tokens=10, min_new_tokens=10)
    together = generate(model, batch, mask, **settings)
    for row, prompt in enumerate(prompts):
        alone = generate(model, prompt[None], **settings)
        assert torch.equal(together.sequences[row, -10:], alone.sequences[0, -10:])
        for step_together, step_alone in zip(together.scores, alone.scores):
            torch.testing.assert_close(step_together[row], step_alone[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_cache_size_does_not_grow_with_generated_tokens(build, model_class, variant):
    model = build(model_class, **VARIANTS[variant])
    inputs = tokens(2, 7)
    sizes = {}
    for new_tokens in (8, 160):
        output = generate(model, inputs, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        assert output.sequences.shape[1] >= new_tokens
        states = output.cache.self_attention_cache if model.config.is_encoder_decoder else output.cache
        assert all(isinstance(layer, FastformerCacheLayer) for layer in states.layers)
        assert output.cache.get_seq_length() >= new_tokens
        sizes[new_tokens] = cache_nbytes(output.cache)
    assert sizes[8] == sizes[160] > 0


def test_source_padding_never_changes_decoder_logits(build):
    model = build(FastformerForConditionalGeneration, share_layers=False)
    source, decoder_ids = tokens(1, 5, seed=3), tokens(1, 6, seed=4)
    with torch.no_grad():
        alone = model(source, decoder_input_ids=decoder_ids).logits
        for padded, mask in [
            (torch.cat([torch.full((1, 3), PAD), source], 1), torch.tensor([[0] * 3 + [1] * 5])),
            (torch.cat([source, torch.full((1, 3), PAD)], 1), torch.tensor([[1] * 5 + [0] * 3])),
        ]:
            torch.testing.assert_close(model(padded, attention_mask=mask, decoder_input_ids=decoder_ids).logits, alone)


@pytest.mark.parametrize("cross_attention_type", ["softmax", "additive"])
def test_all_padding_source_is_finite(build, cross_attention_type):
    model = build(FastformerForConditionalGeneration, cross_attention_type=cross_attention_type)
    source = tokens(2, 5)
    mask = torch.ones_like(source)
    mask[1] = 0
    with torch.no_grad():
        out = model(source, attention_mask=mask, decoder_input_ids=tokens(2, 4))
    assert torch.isfinite(out.logits).all()


def test_labels_give_teacher_forced_cross_entropy_without_double_shift(build):
    model = build(FastformerForConditionalGeneration)
    source, labels = tokens(2, 6), tokens(2, 5, seed=9)
    labels[1, 3:] = -100
    with torch.no_grad():
        out = model(source, labels=labels)
        decoder_ids = model.shift_labels_right(labels)
        expected_logits = model(source, decoder_input_ids=decoder_ids).logits
    # decoder_start_token_id, then the labels without the last one, -100 turned into padding
    assert torch.equal(decoder_ids[:, 0], torch.full((2,), START))
    assert torch.equal(decoder_ids[:, 1:], torch.where(labels[:, :-1] == -100, PAD, labels[:, :-1]))
    torch.testing.assert_close(out.logits, expected_logits)
    expected = torch.nn.functional.cross_entropy(out.logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(out.loss, expected)


def test_causal_lm_loss_predicts_the_next_token(build):
    model = build(FastformerForCausalLM)
    ids = tokens(2, 6)
    with torch.no_grad():
        out = model(ids, labels=ids)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, VOCAB), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("reentrant", [False, True], ids=["non-reentrant", "reentrant"])
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_gradient_checkpointing_gives_the_same_gradients(build, model_class, variant, reentrant):
    """Reentrant checkpointing (transformers' common test `test_training_gradient_checkpointing_use_reentrant_true`)
    sends gradients back only through a layer's positional tensors: the cross-attention's keys and values are."""

    def gradients(checkpointing):
        model = build(model_class, **VARIANTS[variant]).train()
        if checkpointing:
            model.activation_checkpointing_enable({"use_reentrant": reentrant})
        ids = tokens(2, 6)
        if model_class is FastformerForConditionalGeneration:
            loss = model(tokens(2, 5, seed=3), labels=ids).loss
        else:
            loss = model(ids, labels=ids).loss
        loss.backward()
        return {name: p.grad for name, p in model.named_parameters()}

    plain, checkpointed = gradients(False), gradients(True)
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-6, atol=1e-7, msg=name)


def test_embeddings_and_lm_head_are_shared(build):
    seq2seq = build(FastformerForConditionalGeneration)
    shared = seq2seq.get_encoder().embeddings.word_embeddings.weight
    assert seq2seq.get_decoder().embeddings.word_embeddings.weight is shared and seq2seq.lm_head.weight is shared
    causal = build(FastformerForCausalLM)
    assert causal.lm_head.weight is causal.decoder.embeddings.word_embeddings.weight


def test_a_config_serves_both_generation_classes_unchanged(tiny_config):
    config = tiny_config()
    assert FastformerForConditionalGeneration(config).config.is_encoder_decoder
    assert not FastformerForCausalLM(config).config.is_encoder_decoder
    assert not config.is_encoder_decoder


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_a_short_convolution_added_to_a_saved_decoder_is_initialized_and_keeps_every_saved_weight(
    build, model_class, tmp_path
):
    """A checkpoint saved without it (a converted BERT-family model, the recipe's start), loaded with
    `decoder_conv_kernel`: every saved weight is kept, each layer's convolution is drawn as the model's
    `_init_weights` draws it (normal, initializer_range), the logits change with it, and the loss reaches every
    layer's."""
    model = build(model_class)
    model.save_pretrained(tmp_path)
    config = FastformerCopyConfig.from_pretrained(tmp_path, decoder_conv_kernel=4)
    loaded = model_class.from_pretrained(tmp_path, config=config).eval()
    weights = [layer.attention.convolution.weight for layer in loaded.get_decoder().layers]
    assert all(weight.shape == (32, 1, 4) and 0.1 < weight.std() < 0.3 for weight in weights)  # initializer_range 0.2
    for key, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], tensor), key
    inputs = tokens(2, 6)
    assert not torch.allclose(logits(loaded, inputs), logits(model, inputs))
    source = inputs if model_class is FastformerForCausalLM else tokens(2, 9, seed=7)  # the seq2seq model's article
    loaded(input_ids=source, labels=inputs).loss.backward()
    assert all(weight.grad is not None and weight.grad.abs().sum() > 0 for weight in weights)


def test_a_seq2seq_checkpoint_does_not_load_as_a_causal_lm(build, tmp_path):
    build(FastformerForConditionalGeneration).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="load the checkpoint with FastformerForConditionalGeneration"):
        FastformerForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "settings", [dict(assistant_model="self"), dict(penalty_alpha=0.6, top_k=4)], ids=["assisted", "contrastive"]
)
def test_assisted_and_contrastive_decoding_are_refused(build, settings):
    model = build(FastformerForConditionalGeneration)
    settings = {k: model if v == "self" else v for k, v in settings.items()}
    with pytest.raises(ValueError, match="only supports .*'greedy_search', 'sample', 'beam_search', 'beam_sample'"):
        model.generate(tokens(1, 5), max_new_tokens=3, trust_remote_code=True, **settings)


@pytest.mark.parametrize("kernel", [0, 3], ids=["plain", "short-convolution"])
def test_cache_rows_follow_beam_reordering_and_cannot_be_cropped(build, kernel):
    """Beam search's reordering, and the row selection and repetition of contrastive search and of expanded inputs,
    move every state's rows (with the short convolution, its last inputs too)."""
    model = build(FastformerForCausalLM, decoder_conv_kernel=kernel)
    cache = empty_cache(model)
    logits(model, tokens(3, 4), cache=cache)
    before = [t.clone() for t in state_tensors(cache)]
    assert len(before) == model.config.num_decoder_layers * (5 if kernel else 4)
    cache.reorder_cache(torch.tensor([2, 0, 0]))
    for old, new in zip(before, state_tensors(cache), strict=True):
        assert torch.equal(new, old[[2, 0, 0]])
    cache.batch_select_indices(torch.tensor([1, 2]))
    cache.batch_repeat_interleave(2)
    for old, new in zip(before, state_tensors(cache), strict=True):
        assert torch.equal(new, old[[0, 0, 0, 0]])
    with pytest.raises(ValueError, match="cannot be rolled back"):
        cache.crop(1)


def test_beam_reordering_moves_both_sides_as_bart(build):
    """An `EncoderDecoderCache` as BART's: beam search reorders the decoder's state and the source's keys and
    values alike."""
    model = build(FastformerForConditionalGeneration, share_layers=False)
    cache = empty_cache(model)
    logits(model, tokens(3, 4), cache=cache)
    cross = [(layer.keys.clone(), layer.values.clone()) for layer in cache.cross_attention_cache.layers]
    states = [tensor.clone() for tensor in state_tensors(cache.self_attention_cache)]
    cache.reorder_cache(torch.tensor([2, 0, 0]))
    for layer, (keys, values) in zip(cache.cross_attention_cache.layers, cross, strict=True):
        assert torch.equal(layer.keys, keys[[2, 0, 0]]) and torch.equal(layer.values, values[[2, 0, 0]])
    for old, new in zip(states, state_tensors(cache.self_attention_cache), strict=True):
        assert torch.equal(new, old[[2, 0, 0]])


def test_decoding_past_the_positions_is_a_clear_error(build):
    model = build(FastformerForCausalLM, max_position_embeddings=8)
    with pytest.raises(ValueError, match="`input_ids` sequence reaches more than 8 positions"):
        logits(model, tokens(1, 9))


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_transformers_itself_refuses_assisted_decoding(build, model_class):
    """A recurrent state cannot be rolled back, and transformers must know it without our list of supported modes:
    it reads the cache's `is_croppable` after the first forward."""
    model = build(model_class)
    assert empty_cache(model).is_croppable is False
    model._supported_generation_modes = None
    with pytest.raises(ValueError, match="not supported with stateful models|cache that can be cropped"):
        model.generate(
            tokens(1, 5), max_new_tokens=3, cache=empty_cache(model), assistant_model=build(model_class, seed=1)
        )


@pytest.mark.parametrize("share_layers", [True, False], ids=["shared-layers", "unshared"])
def test_cross_attention_encodes_the_source_once_per_distinct_layer(build, share_layers, monkeypatch):
    model = build(FastformerForConditionalGeneration, share_layers=share_layers)
    distinct = 1 if share_layers else model.config.num_decoder_layers
    calls = []
    encode = FastformerCrossAttention.encode
    monkeypatch.setattr(FastformerCrossAttention, "encode", lambda *args: calls.append(1) or encode(*args))
    cache = empty_cache(model)
    for piece in range(3):  # a prompt and two decoding steps
        logits(model, tokens(2, 4 if piece == 0 else 1, seed=piece), cache=cache)
    assert len(calls) == distinct
    assert sum(layer.keys is not None for layer in cache.cross_attention_cache.layers) == distinct
    calls.clear()
    logits(model, tokens(2, 4), use_cache=False)  # a training forward: no cache, still once per distinct layer
    assert len(calls) == distinct


def test_shared_layers_store_the_encoder_side_once(build):
    shared, unshared = (build(FastformerForConditionalGeneration, share_layers=sharing) for sharing in (True, False))
    sizes = {}
    for model in (shared, unshared):
        cache = empty_cache(model)
        logits(model, tokens(2, 4), cache=cache)
        sizes[model.config.share_layers] = cache_nbytes(cache.cross_attention_cache)
    assert sizes[False] == model.config.num_decoder_layers * sizes[True] > 0


def test_generation_stops_at_any_of_several_eos_ids(build):
    model = build(FastformerForCausalLM, eos_token_id=None)
    free = generate(model, tokens(1, 5), max_new_tokens=6).sequences[0, 5:]
    # a token greedy decoding emits after the first, and had not emitted before
    index = next(i for i in range(1, len(free)) if int(free[i]) not in free[:i].tolist())
    stop = int(free[index])
    model = build(FastformerForCausalLM, eos_token_id=[EOS, stop])
    assert model.generation_config.eos_token_id == [EOS, stop]
    stopped = generate(model, tokens(1, 5), max_new_tokens=6).sequences[0, 5:]
    assert stopped.tolist() == free[: index + 1].tolist()


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_logits_to_keep_computes_the_last_positions_only(build, model_class):
    model = build(model_class)
    ids = tokens(2, 6)
    full = logits(model, ids, use_cache=False)
    torch.testing.assert_close(logits(model, ids, use_cache=False, logits_to_keep=1), full[:, -1:])
    kept = logits(model, ids, use_cache=False, logits_to_keep=torch.tensor([0, 3]))
    torch.testing.assert_close(kept, full[:, [0, 3]])
    widths = []  # generate() asks for the last position of the prompt pass only
    model.lm_head.register_forward_hook(lambda module, args, out: widths.append(args[0].shape[1]))
    generate(model, ids, max_new_tokens=3)
    assert widths == [1, 1, 1]


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_output_attentions_returns_the_decoders_pooling_weights(build, model_class):
    """Per layer application, alpha and beta of every position over its prefix (B, H, 2, T, T): left padding gets
    no weight, every row of a real token sums to one, and the cross-attention's softmax weights (B, H, T, M)."""
    model = build(model_class, share_layers=False)
    model.set_attn_implementation("eager")
    ids, mask = tokens(2, 6), torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0
    flags = dict(output_attentions=True, use_cache=False)
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            output = model(tokens(2, 9, seed=7), decoder_input_ids=ids, decoder_attention_mask=mask, **flags)
        else:
            output = model(ids, attention_mask=mask, **flags)
    decoder = output.decoder_attentions if model.config.is_encoder_decoder else output.attentions
    assert len(decoder) == model.config.num_decoder_layers
    for weights in decoder:
        assert weights.shape == (2, 4, 2, 6, 6)
        assert torch.equal(weights, weights.tril())  # no position weighs a later token
        assert (weights[1, :, :, :, :2] == 0).all()  # nor padding
        torch.testing.assert_close(weights[0].sum(-1), torch.ones(4, 2, 6))
        torch.testing.assert_close(weights[1, :, :, 2:].sum(-1), torch.ones(4, 2, 4))
    if model.config.is_encoder_decoder:
        assert [tuple(weights.shape) for weights in output.cross_attentions] == [(2, 4, 6, 9)] * 3
        torch.testing.assert_close(output.cross_attentions[0].sum(-1), torch.ones(2, 4, 6))


@pytest.mark.parametrize("model_class", MODELS, ids=lambda c: c.__name__)
def test_output_attentions_after_cached_tokens_is_refused_not_dropped(build, model_class):
    """Refused before any state moves on (with the short convolution, whose state is updated first): the same step
    again, without them, gives one pass's logits."""
    model = build(model_class, share_layers=False, decoder_conv_kernel=3)
    cache = empty_cache(model)
    logits(model, tokens(2, 4), cache=cache)
    with pytest.raises(ValueError, match=r"`output_attentions=True` needs the decoder's whole sequence"):
        logits(model, tokens(2, 1), cache=cache, output_attentions=True)
    whole = torch.cat((tokens(2, 4), tokens(2, 1)), dim=1)
    torch.testing.assert_close(logits(model, tokens(2, 1), cache=cache)[:, -1], logits(model, whole)[:, -1])
    with torch.no_grad():  # without a cache, generate() can return them
        output = model.generate(
            tokens(2, 4), max_new_tokens=2, use_cache=False, output_attentions=True, return_dict_in_generate=True
        )
    steps = output.decoder_attentions if model.config.is_encoder_decoder else output.attentions
    assert len(steps) == 2 and all(len(step) == model.config.num_decoder_layers for step in steps)


@pytest.mark.parametrize("share_layers", [True, False], ids=["shared-layers", "unshared"])
def test_eager_and_sdpa_cross_attention_load_and_agree(build, share_layers, tmp_path):
    """The softmax cross-attention goes through transformers' attention functions: `attn_implementation` is
    honoured at loading, and "eager" and "sdpa" give the same logits, a padded and an all-padding source included."""
    build(FastformerForConditionalGeneration, share_layers=share_layers).save_pretrained(tmp_path)
    source, decoder_ids = tokens(3, 9, seed=7), tokens(3, 5, seed=4)
    mask = torch.ones_like(source)
    mask[1, 6:] = 0
    mask[2] = 0
    outputs = {}
    for implementation in ("eager", "sdpa"):
        model = FastformerForConditionalGeneration.from_pretrained(tmp_path, attn_implementation=implementation)
        assert model.config._attn_implementation == implementation
        with torch.no_grad():
            outputs[implementation] = model(source, attention_mask=mask, decoder_input_ids=decoder_ids).logits
    assert torch.isfinite(outputs["eager"]).all()
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], rtol=1e-5, atol=1e-5)


def test_a_registered_attention_function_serves_the_cross_attention(build):
    calls = []

    def counted(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return sdpa_attention_forward(module, *args, **kwargs)

    AttentionInterface.register("counted_sdpa", counted)
    model = build(FastformerForConditionalGeneration, share_layers=False)
    expected = logits(model, tokens(2, 4), use_cache=False)
    model.set_attn_implementation("counted_sdpa")
    torch.testing.assert_close(logits(model, tokens(2, 4), use_cache=False), expected)
    assert calls == ["FastformerCrossAttention"] * model.config.num_decoder_layers
