"""fastformer/export.py and scripts/export_onnx.py: torch.export programs and ONNX files of the encoder heads, run
at batch sizes and lengths the export did not trace, against the eager model (ONNX Runtime for the files); the
seq2seq model as an encoder graph and a decoding-step graph whose state is explicit, decoded greedily on ONNX
Runtime against generate()."""

import functools
import json

import numpy as np
import onnxruntime
import pytest
import torch
from transformers import BertConfig, BertModel

from export_seq2seq_onnx import export_seq2seq_onnx, initial_state, onnx_greedy_generate, onnx_sessions
from fastformer import (
    FastformerCopyForConditionalGeneration,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from fastformer.cli import export_onnx
from fastformer.export import EXAMPLE_SHAPE, OUTPUT_NAMES, export_program, exported_attention_mode, using_attention_mode
from fastformer.export import export_onnx as export_onnx_file
from tests.in_process import run_in_process

# the classifier's export is checked by the export script's test
HEADS = [FastformerModel, FastformerForMaskedLM]
NEW_SHAPES = [(3, 7), (1, 41)]  # (batch, length): neither is EXAMPLE_SHAPE
assert EXAMPLE_SHAPE not in NEW_SHAPES


def padded_inputs(vocab_size, batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(vocab_size, (batch, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, length // 2 :] = 0
    return input_ids, attention_mask


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    """One layer (an export traces every layer's operations again: seconds each), the decoder too."""
    return functools.partial(tiny_config, num_hidden_layers=1)


@pytest.fixture(scope="module")
def exported(build, tmp_path_factory):
    """exported(head, implementation) -> the model and an ONNX Runtime session of its export, each exported once."""

    @functools.cache
    def export(head, implementation):
        model = build(head)
        model.set_additive_attention_mode(implementation)
        path = export_onnx_file(model, tmp_path_factory.mktemp("onnx") / "model.onnx")
        return model, onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    return export


def assert_runs_like_the_model(model, session, max_difference=1e-4):
    names = OUTPUT_NAMES[type(model).__name__]
    assert [output.name for output in session.get_outputs()] == list(names)
    for batch, length in NEW_SHAPES:
        input_ids, attention_mask = padded_inputs(model.config.vocab_size, batch, length)
        with torch.no_grad():
            expected = model(input_ids=input_ids, attention_mask=attention_mask)
        outputs = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
        for name, value in zip(names, outputs, strict=True):
            assert value.shape == tuple(expected[name].shape), name
            np.testing.assert_allclose(value, expected[name].numpy(), rtol=0, atol=max_difference, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("head", HEADS, ids=lambda head: head.__name__)
def test_onnx_runtime_runs_each_head_like_the_model_at_new_lengths(exported, head):
    assert_runs_like_the_model(*exported(head, "auto"))


@pytest.mark.slow
def test_onnx_runtime_runs_the_plain_attention_like_the_model(exported):
    """The plain attention lives in the encoder's layers; the heads put the same layers on top in either mode, and
    their exports are checked above."""
    assert_runs_like_the_model(*exported(FastformerModel, "plain"))


@pytest.mark.slow
def test_padding_in_the_onnx_graph_does_not_change_the_real_tokens(exported):
    model, session = exported(FastformerModel, "auto")
    input_ids, _ = padded_inputs(model.config.vocab_size, 1, 9)
    alone = session.run(None, {"input_ids": input_ids.numpy(), "attention_mask": np.ones((1, 9), np.int64)})
    padded_ids = torch.cat([input_ids, torch.zeros(1, 6, dtype=torch.long)], dim=1).numpy()
    mask = np.array([[1] * 9 + [0] * 6], np.int64)
    padded = session.run(None, {"input_ids": padded_ids, "attention_mask": mask})
    np.testing.assert_allclose(padded[0][:, :9], alone[0], rtol=0, atol=1e-5)
    np.testing.assert_allclose(padded[1], alone[1], rtol=0, atol=1e-5)  # the pooled vector too
    nothing = session.run(None, {"input_ids": padded_ids, "attention_mask": np.zeros_like(mask)})
    assert all(np.isfinite(output).all() for output in nothing)  # an all-padding row gives finite numbers


@pytest.mark.parametrize("implementation", ["plain", "collapsed"])
def test_torch_export_program_runs_at_lengths_not_traced(build, implementation):
    model = build(FastformerForSequenceClassification)  # "auto": the export sets the implementation, then restores it
    program = export_program(model, implementation).module()
    for batch, length in [*NEW_SHAPES, (2, model.config.max_position_embeddings)]:
        input_ids, attention_mask = padded_inputs(model.config.vocab_size, batch, length)
        with torch.no_grad():
            expected = model(input_ids=input_ids, attention_mask=attention_mask).logits
            found = program(input_ids=input_ids, attention_mask=attention_mask).logits
        torch.testing.assert_close(found, expected, rtol=0, atol=1e-5)
    assert {layer.attention_mode for layer in model.base_model.layers} == {"auto"}  # restored after the export
    add = build(FastformerForSequenceClassification, interaction="add")
    with pytest.raises(ValueError, match='`mode="collapsed"` folds the product interaction'):
        export_program(add, "collapsed")
    assert {layer.attention_mode for layer in add.base_model.layers} == {"auto"}


def test_the_exported_attention_mode_is_the_layers_with_auto_resolved(build):
    """The mode a graph holds is read from the model's encoder layers (set_additive_attention_mode), "auto" as the
    product interaction's "collapsed" or else "plain"; using_attention_mode restores each layer's own mode."""
    model = build(FastformerForConditionalGeneration, share_layers=False, num_hidden_layers=2)
    assert exported_attention_mode(model) == "collapsed"
    assert exported_attention_mode(build(FastformerModel, interaction="add")) == "plain"
    model.set_additive_attention_mode("plain")
    assert exported_attention_mode(model) == "plain"
    layers = model.get_encoder().layers
    layers[1].attention_mode = "collapsed"
    with pytest.raises(ValueError, match=r"different attention modes \['collapsed', 'plain'\]; pass"):
        exported_attention_mode(model)
    with using_attention_mode(model, "auto"):
        assert [layer.attention_mode for layer in layers] == ["auto", "auto"]
    assert [layer.attention_mode for layer in layers] == ["plain", "collapsed"]


def export_as_bert_exports(model, batch=2, length=16):
    """`torch.export.export` of `model` itself, as transformers' models export: (input_ids,), the attention mask as a
    keyword, the batch and the sequence dynamic."""
    input_ids, attention_mask = padded_inputs(model.config.vocab_size, batch, length)
    dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("sequence", max=model.config.max_position_embeddings)}
    with torch.no_grad():
        return torch.export.export(
            model,
            (input_ids,),
            kwargs={"attention_mask": attention_mask},
            dynamic_shapes={"input_ids": dims, "attention_mask": dims},
        ).module()


@pytest.mark.parametrize("head", [FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM])
def test_torch_export_of_the_default_mode_runs_at_every_length_as_berts(build, head):
    """Under the default attention mode "auto", whose choice follows the length in eager mode, the model
    exports with a dynamic batch and length as BERT does, and the program gives the eager outputs on either side of
    "auto"'s threshold: (8, 64) takes the collapsed path in eager mode, the other shapes the plain one."""
    bert = BertModel(
        BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=37)
    ).eval()
    model = build(head)
    layer = model.base_model.layers[0]
    assert layer.attention_mode == "auto"
    with torch.no_grad():
        assert layer.uses_collapsed_attention(torch.zeros(8, 64, 32))
        assert not layer.uses_collapsed_attention(torch.zeros(3, 7, 32))
    for eager, name in ((bert, "last_hidden_state"), (model, OUTPUT_NAMES[head.__name__][0])):
        program = export_as_bert_exports(eager)
        for batch, length in [(1, 5), *NEW_SHAPES, (8, 64)]:
            input_ids, attention_mask = padded_inputs(99, batch, length)
            with torch.no_grad():
                expected = eager(input_ids, attention_mask=attention_mask)
                found = program(input_ids, attention_mask=attention_mask)
            torch.testing.assert_close(found[name], expected[name], rtol=0, atol=1e-5)


def test_export_refuses_what_it_cannot_export(build):
    with pytest.raises(ValueError, match="export the encoder-decoder with scripts/export_seq2seq_onnx.py"):
        export_program(build(FastformerForConditionalGeneration))
    with pytest.raises(ValueError, match="export_seq2seq_onnx exports a FastformerForConditionalGeneration"):
        export_seq2seq_onnx(build(FastformerModel), "unused")
    with pytest.raises(ValueError, match=r"Call model.eval\(\) before exporting"):
        export_program(build(FastformerModel).train())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("cross_attention_type", "copy_mechanism", "copy_spans", "kernel"),
    [
        ("softmax", False, False, 0),
        ("additive", True, False, 0),
        ("softmax", True, True, 0),
        ("softmax", False, False, 3),
    ],
    ids=["softmax", "additive-copy", "softmax-copy-spans-context", "softmax-short-convolution"],
)
def test_onnx_greedy_decoding_with_the_state_as_inputs_gives_the_tokens_of_generate(
    build, cross_attention_type, copy_mechanism, copy_spans, kernel, tmp_path
):
    """Each cross-attention, the additive one with the copy head (which reads the encoder's output and the source's
    ids at every step, whatever the cross-attention), the copy head with the span gate (which also reads the
    step's input ids) and the source context (a convolution over the source, whose length is not traced), and the
    decoder's short convolution (whose last inputs are state tensors too)."""
    special = dict(pad_token_id=0, decoder_start_token_id=1, bos_token_id=1, eos_token_id=2)
    # larger initial weights: a random model that does not repeat one token
    model = build(
        FastformerCopyForConditionalGeneration if copy_mechanism else FastformerForConditionalGeneration,
        initializer_range=0.5,
        cross_attention_type=cross_attention_type,
        copy_spans=copy_spans,
        copy_context_window=3 if copy_spans else 0,
        decoder_conv_kernel=kernel,
        **special,
    )
    if copy_spans:  # a gate that differs per token, and a source context that changes the keys
        torch.nn.init.normal_(model.copy_head.span_gate.weight, std=0.5)
        torch.nn.init.normal_(model.copy_head.source_context.weight, std=0.5)
    export_seq2seq_onnx(model, tmp_path)
    sessions = onnx_sessions(tmp_path)
    input_ids, attention_mask = padded_inputs(model.config.vocab_size, 4, 29)  # source length and batch not traced
    input_ids[input_ids < 3] = 3  # no special token in the source

    def generate():
        return model.generate(
            input_ids, attention_mask=attention_mask, do_sample=False, num_beams=1, max_new_tokens=20
        ).numpy()

    def on_onnx_runtime(max_new_tokens=20, generation_config=model.generation_config):
        return onnx_greedy_generate(
            sessions, model.config, input_ids.numpy(), attention_mask.numpy(), max_new_tokens, generation_config
        )

    expected = generate()
    assert len(np.unique(expected[:, 1:])) > 4
    np.testing.assert_array_equal(on_onnx_runtime(), expected)
    # the first step's logits, as one forward gives them
    encoder, step = sessions
    cross = encoder.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    feeds = {
        "input_ids": expected[:, :1],
        "positions": np.zeros(len(expected), np.int64),
        "source_ids": input_ids.numpy(),
    }
    feeds |= {
        "encoder_attention_mask": attention_mask.numpy(),
        **{f"cross.{i}": tensor for i, tensor in enumerate(cross)},
    }
    feeds |= {f"state.{i}": tensor.numpy() for i, tensor in enumerate(initial_state(model.config, len(expected)))}
    read = {graph_input.name for graph_input in step.get_inputs()}
    assert ("source_ids" in read) == copy_mechanism
    logits = step.run(None, {name: value for name, value in feeds.items() if name in read})[0]
    with torch.no_grad():
        first = model(input_ids, attention_mask=attention_mask, decoder_input_ids=torch.from_numpy(expected[:, :1]))
    np.testing.assert_allclose(logits, first.logits[:, 0].numpy(), rtol=0, atol=1e-4)
    # generate() reads the generation config: a token the model writes early as its end of sequence, rows stop
    # there and are padded
    model.generation_config.eos_token_id = int(expected[0, 3])
    expected = generate()
    assert expected.shape[1] < 21 or (expected == 0).any()
    np.testing.assert_array_equal(on_onnx_runtime(), expected)
    with pytest.raises(ValueError, match="max_new_tokens=65 reaches past the decoder's 64 positions"):
        on_onnx_runtime(65)
    model.generation_config.no_repeat_ngram_size = 3  # a logits processor the loop does not have
    with pytest.raises(ValueError, match=r"plain greedy search; the generation config also sets \{'no_repeat_ngram"):
        on_onnx_runtime()


def run_script(*flags):
    return run_in_process(["python", export_onnx.__file__, *flags])


@pytest.mark.slow
def test_script_exports_the_checkpoints_head_with_its_tokenizer(build, tokenizer, tmp_path):
    """A converted classifier's: its [CLS] attends by softmax in the last layer (`cls_attention_heads`)."""
    model = build(FastformerForSequenceClassification, vocab_size=len(tokenizer), cls_attention_heads=2)
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    process = run_script("--model_name_or_path", tmp_path / "model", "--output_dir", tmp_path / "onnx", "--int8")
    assert process.returncode == 0, process.stderr[-3000:]
    check = json.loads((tmp_path / "onnx" / "onnx_check.json").read_text())
    assert check["task"] == "text-classification" and check["additive_attention_mode"] == "collapsed"
    assert 0 <= check["max_abs_difference"]["logits"] <= 1e-4
    # int8 weights: further from PyTorch, within 5% of the largest logit (the tolerance docs/DEPLOY.md states)
    int8 = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model_quantized.onnx"))
    input_ids, attention_mask = padded_inputs(model.config.vocab_size, 4, 30)
    (quantized,) = int8.run(None, {"input_ids": input_ids.numpy(), "attention_mask": attention_mask.numpy()})
    with torch.no_grad():
        full = model(input_ids=input_ids, attention_mask=attention_mask).logits.numpy()
    assert 1e-4 < np.abs(quantized - full).max() <= 0.05 * np.abs(full).max()
    assert 0 < check["int8_max_abs_difference"]["logits"] <= 0.05 * np.abs(full).max()
    assert {"config.json", "tokenizer.json", "model.onnx"} <= {path.name for path in (tmp_path / "onnx").iterdir()}
    session = onnxruntime.InferenceSession(str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    batch = tokenizer(["A short text.", "A longer text, padded by the other one."], padding=True, return_tensors="np")
    (logits,) = session.run(None, {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})
    with torch.no_grad():
        expected = model(
            **tokenizer(["A short text.", "A longer text, padded by the other one."], padding=True, return_tensors="pt")
        ).logits
    np.testing.assert_allclose(logits, expected.numpy(), rtol=0, atol=1e-4)

    # a difference above --atol fails the export and leaves the folder as it was: the earlier export stays whole
    before = {path.name: path.read_bytes() for path in (tmp_path / "onnx").iterdir()}
    failed = run_script("--model_name_or_path", tmp_path / "model", "--output_dir", tmp_path / "onnx", "--atol", 0)
    assert failed.returncode == 1 and "ONNX Runtime differs from PyTorch" in failed.stderr
    assert {path.name: path.read_bytes() for path in (tmp_path / "onnx").iterdir()} == before
    # exported again without --int8: the earlier model's quantization goes with it
    assert run_script("--model_name_or_path", tmp_path / "model", "--output_dir", tmp_path / "onnx").returncode == 0
    assert not (tmp_path / "onnx" / "model_quantized.onnx").exists()
    assert "int8_max_abs_difference" not in json.loads((tmp_path / "onnx" / "onnx_check.json").read_text())


def test_script_refuses_a_model_that_is_not_a_fastformer(tmp_path):
    from transformers import BertConfig  # noqa: PLC0415

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path / "bert")
    process = run_script("--model_name_or_path", tmp_path / "bert", "--output_dir", tmp_path / "onnx")
    assert process.returncode == 1
    assert "is a 'bert' model, not Fastformer" in process.stderr.strip().splitlines()[-1]
