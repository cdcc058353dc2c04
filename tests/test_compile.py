"""torch.compile(fullgraph=True) on the encoder and on one cached decoding step, and the decoders compiled with
dynamic shapes, against eager mode.

What the model's code decides is Dynamo's capture (one graph, no recompilation per token) and AOTAutograd's
tracing (decompositions, functionalization, a state that moves on as in eager mode): the "aot_eager" backend runs
both, without inductor's C++ code generation, whose first compile on a machine with an empty inductor cache costs
about 20 s whatever the graph (a one-line function: 24 s, other work beside it), more than the rest of this module
takes."""

import copy
import functools

import pytest
import torch
from transformers import CompileConfig

from export_seq2seq_onnx import state_tensors
from fastformer import (
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForSequenceClassification,
    FastformerModel,
)
from tests.conftest import empty_cache


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(
        tiny_config,
        intermediate_size=64,
        num_decoder_layers=2,
        share_layers=False,
        decoder_start_token_id=1,
        initializer_range=0.2,
    )


def padded_batch():
    ids = torch.randint(1, 99, (2, 16), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    return ids, mask


@pytest.mark.slow
@torch.no_grad()
def test_encoder_compiles_as_one_graph(build):
    model = build(FastformerModel)
    ids, mask = padded_batch()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    expected = model(ids, attention_mask=mask)
    result = compiled(ids, attention_mask=mask)
    torch.testing.assert_close(result.last_hidden_state, expected.last_hidden_state, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(result.pooler_output, expected.pooler_output, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bf16-autocast"])
def test_training_forward_compiles_as_one_graph(build, dtype):
    """A classifier's training step (train mode, labels, the mask made once, the fused poolings) captured whole: eager
    mode's loss and gradients, float32 and under bf16 autocast."""
    torch._dynamo.reset()
    ids, mask = padded_batch()
    labels = torch.tensor([0, 2])
    results = []
    for compile_it in (False, True):
        model = build(FastformerForSequenceClassification).train()
        forward = torch.compile(model, fullgraph=True, backend="aot_eager") if compile_it else model
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = forward(ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        results.append((loss.detach(), [parameter.grad for parameter in model.parameters()]))
    (eager_loss, eager_grads), (loss, grads) = results
    tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(loss, eager_loss, **tolerance)
    for grad, eager_grad in zip(grads, eager_grads, strict=True):
        torch.testing.assert_close(grad, eager_grad, **tolerance)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", [0, 3], ids=["plain", "short-convolution"])
@torch.no_grad()
def test_decoding_step_compiles_as_one_graph_that_follows_eager_mode_without_recompiling(build, kernel):
    """Token after token, the compiled step gives eager mode's logits and moves its state on alike (with the short
    convolution, its inputs too). The step's inputs change at every token only in values and in the count of tokens
    seen (a Python int): after the second step (where dynamo makes that count dynamic) no step compiles again."""
    torch._dynamo.reset()
    model = build(FastformerForConditionalGeneration, decoder_conv_kernel=kernel)
    ids, mask = padded_batch()
    encoder_outputs = model.get_encoder()(ids, attention_mask=mask)
    eager_cache = empty_cache(model)
    prefix = torch.tensor([[1, 5, 7], [1, 9, 4]])
    model(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=prefix, cache=eager_cache)
    compiled_cache = copy.deepcopy(eager_cache)
    step = torch.compile(model, fullgraph=True, backend="aot_eager")
    token = torch.tensor([[3], [8]])

    def step_both():
        nonlocal token
        inputs = dict(encoder_outputs=encoder_outputs, attention_mask=mask, decoder_input_ids=token)
        expected, result = model(**inputs, cache=eager_cache), step(**inputs, cache=compiled_cache)
        torch.testing.assert_close(result.logits, expected.logits, rtol=1e-5, atol=1e-5)
        compiled_states, eager_states = compiled_cache.self_attention_cache, eager_cache.self_attention_cache
        compiled, eager = (state_tensors(states) for states in (compiled_states, eager_states))
        for compiled_tensor, eager_tensor in zip(compiled, eager, strict=True):
            torch.testing.assert_close(compiled_tensor, eager_tensor, rtol=1e-5, atol=1e-5)
        token = expected.logits[:, -1].argmax(-1, keepdim=True)

    step_both()
    step_both()
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(6):
            step_both()  # raises if the step compiles again
    assert compiled_cache.get_seq_length() == eager_cache.get_seq_length() == 11


DECODERS = [FastformerForCausalLM, FastformerForConditionalGeneration]


def decoder_inputs(model_class, length, **extra):
    """A forward pass's inputs with `length` decoder tokens: the causal LM's ids, or the encoder-decoder's padded
    source (`padded_batch`) and decoder ids."""
    ids = torch.randint(1, 99, (2, length), generator=torch.Generator().manual_seed(length))
    if model_class is FastformerForCausalLM:
        return dict(input_ids=ids, **extra)
    source, mask = padded_batch()
    return dict(input_ids=source, attention_mask=mask, decoder_input_ids=ids, **extra)


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "recompiled-dynamic"])
@torch.no_grad()
def test_decoder_compiles_with_a_dynamic_length(build, dynamic):
    """With a symbolic length (as GPT-2 and BART compile): no zero chunk padding, an F.pad that would clone its input
    in the input's strides where the graph takes it as contiguous. With dynamic=True both lengths run one graph;
    with dynamic=None the second length recompiles it with a dynamic length. (The encoder-decoder's decoder runs the
    same causal pooling: its prompt is compiled with a dynamic length below.)"""
    model_class = FastformerForCausalLM
    torch._dynamo.reset()
    model = build(model_class)
    compiled = torch.compile(model, backend="aot_eager", dynamic=dynamic)
    for length in (7, 9):
        inputs = decoder_inputs(model_class, length)
        with torch._dynamo.config.patch(error_on_recompile=dynamic and length == 9):
            result = compiled(**inputs)
        torch.testing.assert_close(result.logits, model(**inputs).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("model_class", DECODERS, ids=lambda model_class: model_class.__name__)
@torch.no_grad()
def test_cached_decoding_compiles_with_dynamic_shapes(build, model_class):
    """A prompt, then one token continuing its cache, both through the model compiled with dynamic=True and
    use_cache=True: eager mode's logits, and its recurrent states after them."""
    torch._dynamo.reset()
    model = build(model_class)
    compiled = torch.compile(model, backend="aot_eager", dynamic=True)
    eager_cache, compiled_cache = empty_cache(model), empty_cache(model)
    inputs = decoder_inputs(model_class, 7, use_cache=True)
    if model_class is FastformerForConditionalGeneration:  # the encoder once, as generate() runs it
        source = inputs.pop("input_ids")
        inputs["encoder_outputs"] = model.get_encoder()(source, attention_mask=inputs["attention_mask"])
    decoder_ids = "input_ids" if model_class is FastformerForCausalLM else "decoder_input_ids"
    for _ in range(2):
        expected, result = model(**inputs, cache=eager_cache), compiled(**inputs, cache=compiled_cache)
        torch.testing.assert_close(result.logits, expected.logits, rtol=1e-5, atol=1e-5)
        inputs[decoder_ids] = expected.logits[:, -1:].argmax(-1)
    if model_class is FastformerForConditionalGeneration:
        eager_cache, compiled_cache = eager_cache.self_attention_cache, compiled_cache.self_attention_cache
    for compiled_state, eager_state in zip(state_tensors(compiled_cache), state_tensors(eager_cache), strict=True):
        torch.testing.assert_close(compiled_state, eager_state, rtol=1e-5, atol=1e-5)
    assert compiled_cache.get_seq_length() == eager_cache.get_seq_length() == 8


@pytest.mark.slow
def test_generate_compiles_the_decoding_steps_once_with_a_static_cache(build):
    """generate() compiles the decoding steps for a compilable cache that is not a `DynamicCache` (on a GPU by
    default; here asked for with `compile_config`): with `cache_implementation="static"`, as for GPT-2, it does,
    gives eager mode's tokens, and a longer generation compiles nothing again (the steps' inputs keep their shapes:
    the mask is cut to the new token)."""
    torch._dynamo.reset()
    model = build(FastformerForCausalLM)
    ids, mask = padded_batch()
    eager = model.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False, disable_compile=True)
    compile_config = CompileConfig(backend="aot_eager", mode=None, fullgraph=True)
    compile_config._compile_all_devices = True  # transformers' switch for compiling on a CPU

    def compiled(new_tokens):
        options = dict(max_new_tokens=new_tokens, do_sample=False, compile_config=compile_config)
        return model.generate(ids, attention_mask=mask, cache_implementation="static", **options)

    assert torch.equal(compiled(6), eager) and hasattr(model, "_compiled_call")
    with torch._dynamo.config.patch(error_on_recompile=True):
        compiled(12)
