"""Bad input gets a ValueError naming the argument, the expected and the given value: never a silent wrong
answer or an index error from inside torch. Values (ids, labels, token types) are read inside
`fastformer.checks.value_checks()`, which this module turns on for every test but those about the default
(named `test_by_default_...`)."""

import functools

import pytest
import torch

from fastformer import (
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from fastformer.checks import value_checks

VOCAB, HIDDEN = 99, 32


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(tiny_config, vocab_size=VOCAB, hidden_size=HIDDEN, decoder_start_token_id=1)


IDS = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(0))


@pytest.fixture(autouse=True)
def checked_values(request):
    with value_checks(enabled=not request.node.name.startswith("test_by_default_")):
        yield


@pytest.mark.parametrize(
    "model_class", [FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM, FastformerForCausalLM]
)
@pytest.mark.parametrize(
    "ids, message",
    [
        (torch.tensor([[5, 99, 7]]), r"`input_ids` holds the id 99, outside the vocabulary \[0, 99\)"),
        (torch.tensor([[5, -1, 7]]), r"`input_ids` holds the id -1, outside the vocabulary \[0, 99\)"),
        (torch.tensor([[5.0, 6.0]]), r"`input_ids` must hold integer token ids .*got dtype torch.float32"),
        (torch.tensor([5, 6, 7]), r"`input_ids` must have shape \(batch, seq_len\), got \(3,\)"),
        (torch.ones(1, 65, dtype=torch.long), r"`input_ids` sequence reaches more than 64 positions"),
        (torch.ones(2, 0, dtype=torch.long), r"`input_ids` has no token \(seq_len 0\)"),
    ],
    ids=["id-too-large", "negative-id", "float-ids", "one-dimensional", "too-long", "empty"],
)
def test_bad_input_ids(build, model_class, ids, message):
    with pytest.raises(ValueError, match=message):
        build(model_class)(ids)


@pytest.mark.parametrize(
    "model_class", [FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM, FastformerForCausalLM]
)
@pytest.mark.parametrize(
    "token_type_ids, message",
    [
        (torch.zeros(2, 3, dtype=torch.long), r"`token_type_ids` must have shape \(batch, seq_len\) = \(2, 7\), got"),
        (torch.zeros(7, dtype=torch.long), r"`token_type_ids` must have shape .* = \(2, 7\), got \(7,\)"),
        (torch.zeros(2, 7), r"`token_type_ids` must hold integer token types .*got dtype torch.float32"),
        (torch.full((2, 7), -1), r"`token_type_ids` holds -1, outside \[0, 2\): .* as BERT's"),
    ],
    ids=["short", "one-dimensional", "float", "negative"],
)
def test_bad_token_type_ids(build, model_class, token_type_ids, message):
    with pytest.raises(ValueError, match=message):
        build(model_class)(IDS, token_type_ids=token_type_ids)


def test_the_encoder_decoders_decoder_has_no_token_types(build):
    """As BART's: the encoder-decoder's `token_type_ids` are its encoder's; its decoder, called alone, refuses them."""
    model = build(FastformerForConditionalGeneration)
    assert model.get_decoder().embeddings.token_type_embeddings is None
    with pytest.raises(ValueError, match="decoder has no token types .*, but was given `token_type_ids`"):
        model.get_decoder()(IDS, token_type_ids=torch.zeros_like(IDS))


def test_decoder_inputs_are_named_as_the_argument(build):
    model = build(FastformerForConditionalGeneration)
    with pytest.raises(ValueError, match=r"`decoder_input_ids` holds the id 120, outside the vocabulary"):
        model(IDS, decoder_input_ids=torch.tensor([[1, 120], [1, 2]]))
    with pytest.raises(ValueError, match=r"`input_ids` holds the id 120"):
        model(torch.tensor([[3, 120]]), decoder_input_ids=torch.tensor([[1]]))


def test_bad_embeddings_and_masks(build):
    model = build(FastformerModel)
    with pytest.raises(ValueError, match="exactly one of `input_ids` and `inputs_embeds`"):
        model()
    with pytest.raises(
        ValueError,
        match=r"`inputs_embeds` must have shape \(batch, seq_len, embedding_size=32\), "
        r"got \(2, 7, 16\)",
    ):
        model(inputs_embeds=torch.zeros(2, 7, 16))
    with pytest.raises(ValueError, match=r"`attention_mask` must have shape .* \(2, 7\), got \(2, 6\)"):
        model(IDS, attention_mask=torch.ones(2, 6))
    with pytest.raises(ValueError, match=r"`token_type_ids` holds 2, outside \[0, 2\): .* as BERT's"):
        model(IDS, token_type_ids=torch.full_like(IDS, 2))


@pytest.mark.parametrize(
    "overrides, labels, message",
    [
        ({}, torch.tensor([0, 3]), r"`labels` holds 3, but num_labels is 3: class ids must be in \[0, 3\)"),
        ({}, torch.tensor([0, -5]), r"`labels` holds -5, but num_labels is 3"),
        (
            {},
            torch.tensor([[0, 1], [1, 2]]),
            r"single_label_classification needs `labels` of shape \(batch,\) = "
            r"\(2,\).*got shape \(2, 2\)",
        ),
        (
            {},
            torch.tensor([0.0, 1.0]),
            r"multi_label_classification needs float `labels` of shape .* \(2, 3\), got "
            r"shape \(2,\).*integer class ids need torch.long",
        ),
        (
            {"problem_type": "multi_label_classification"},
            torch.tensor([[0, 1, 1], [1, 0, 0]]),
            r"multi_label_classification needs float `labels`.*dtype torch.int64",
        ),
        ({"problem_type": "regression", "num_labels": 1}, torch.tensor([1, 2]), r"regression needs float `labels`"),
        (
            {"problem_type": "regression", "num_labels": 1},
            torch.tensor([1.0, 2.0, 3.0]),
            r"regression needs float `labels` with num_labels=1 value\(s\) per sequence \(batch=2\)",
        ),
    ],
    ids=[
        "class-too-large",
        "negative-class",
        "2d-class-ids",
        "float-for-single-label",
        "int-multi-label",
        "int-regression",
        "regression-wrong-count",
    ],
)
def test_bad_classification_labels(build, overrides, labels, message):
    with pytest.raises(ValueError, match=message):
        build(FastformerForSequenceClassification, **overrides)(IDS, labels=labels)


def test_good_classification_labels_and_ignore_index_pass(build):
    model = build(FastformerForSequenceClassification)
    assert torch.isfinite(model(IDS, labels=torch.tensor([0, 2])).loss)
    assert torch.isfinite(model(IDS, labels=torch.tensor([[1], [2]])).loss)  # (batch, 1) is accepted as transformers
    multi = build(FastformerForSequenceClassification, problem_type="multi_label_classification")
    assert torch.isfinite(multi(IDS, labels=torch.tensor([[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]])).loss)
    regression = build(FastformerForSequenceClassification, num_labels=1)
    assert torch.isfinite(regression(IDS, labels=torch.tensor([0.5, -1.0])).loss)


@pytest.mark.parametrize("model_class", [FastformerForMaskedLM, FastformerForCausalLM])
def test_bad_token_labels(build, model_class):
    model = build(model_class)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(2, 7\), got \(2, 6\)"):
        model(IDS, labels=IDS[:, :6])
    with pytest.raises(ValueError, match=r"`labels` must hold integer token ids.*torch.float32"):
        model(IDS, labels=IDS.float())
    with pytest.raises(ValueError, match=r"`labels` holds 99: token labels must be ids in \[0, 99\) or -100"):
        model(IDS, labels=torch.where(IDS > 50, 99, IDS))
    ignored = torch.full_like(IDS, -100)
    ignored[:, 3] = IDS[:, 3]
    assert torch.isfinite(model(IDS, labels=ignored).loss)


def test_bad_seq2seq_labels(build):
    model = build(FastformerForConditionalGeneration)
    with pytest.raises(ValueError, match=r"`labels` must have shape \(batch, seq_len\), got \(4,\)"):
        model(IDS, labels=torch.tensor([1, 2, 3, 4]))
    with pytest.raises(ValueError, match=r"`labels` holds 500"):
        model(IDS, labels=torch.tensor([[1, 500], [2, 3]]))
    with pytest.raises(ValueError, match=r"`labels` must have shape \(2, 3\), got \(2, 2\)"):
        model(IDS, decoder_input_ids=torch.ones(2, 3, dtype=torch.long), labels=torch.ones(2, 2, dtype=torch.long))
    assert torch.isfinite(model(IDS, labels=torch.tensor([[5, -100], [6, 7]])).loss)


def test_labels_that_are_views_work_as_copies(build):
    """A slice of a larger tensor (not contiguous) gives the loss of its copy, for every head."""
    wide = torch.randint(3, VOCAB, (2, 14), generator=torch.Generator().manual_seed(1))
    seq2seq = build(FastformerForConditionalGeneration)
    assert seq2seq(IDS, labels=wide[:, ::2]).loss == seq2seq(IDS, labels=wide[:, ::2].clone()).loss
    for model_class in (FastformerForMaskedLM, FastformerForCausalLM):
        model = build(model_class)
        assert model(IDS, labels=wide[:, :7]).loss == model(IDS, labels=wide[:, :7].clone()).loss
    classes = torch.tensor([[0, 9], [2, 9]])[:, 0]
    classifier = build(FastformerForSequenceClassification)
    assert classifier(IDS, labels=classes).loss == classifier(IDS, labels=classes.clone()).loss


def test_checks_keep_the_encoder_compilable(build):
    """The value checks are skipped while torch.compile traces (a data-dependent branch would break the graph)."""
    model = build(FastformerModel)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(IDS).last_hidden_state, model(IDS).last_hidden_state)


# ---- no device-to-host synchronization on accelerator inputs ---------------------------------------------------
# Reading a value of a tensor on an accelerator (`.item()`, `bool(t)`, `if t.any()`) makes the host wait for the
# device, on every forward pass and every decoding step: by default the checks read no value, on any device
# (fastformer/checks.py). Tensors on the "meta" device stand in for an accelerator's here: they have no values at
# all, so any read of a value raises.


def meta(tensor):
    return tensor.to("meta")


@pytest.mark.parametrize("model_class", [FastformerForSequenceClassification, FastformerForMaskedLM])
def test_by_default_the_encoder_reads_no_value_of_accelerator_tensors(build, model_class):
    model = build(model_class).to("meta")
    ids = torch.randint(1, VOCAB, (2, 20))
    labels = torch.tensor([0, 2]) if model_class is FastformerForSequenceClassification else ids
    output = model(
        meta(ids),
        attention_mask=meta(torch.ones_like(ids)),
        token_type_ids=meta(torch.zeros_like(ids)),
        labels=meta(labels),
    )
    assert output.loss.device.type == "meta"
    with pytest.raises(Exception, match="meta"):  # the stand-in works: a value read would have raised
        bool(meta(ids).any())


@pytest.mark.parametrize("model_class", [FastformerForConditionalGeneration, FastformerForCausalLM])
def test_by_default_decoding_steps_read_no_value_of_accelerator_tensors(build, model_class):
    model = build(model_class).to("meta")
    ids = meta(torch.randint(1, VOCAB, (2, 5)))
    mask = meta(torch.ones(2, 5, dtype=torch.long))
    source = dict(input_ids=ids, attention_mask=mask) if model_class is FastformerForConditionalGeneration else {}
    name = "decoder_input_ids" if source else "input_ids"
    step = model(**source, **{name: ids}, use_cache=True)  # the prompt, then two tokens one at a time
    for _ in range(2):
        step = model(**source, **{name: ids[:, :1]}, cache=step.cache, use_cache=True)
    assert step.logits.shape == (2, 1, VOCAB) and step.cache.get_seq_length() == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device to count synchronizations")
def test_by_default_no_synchronization_on_cuda(build):
    model = build(FastformerForConditionalGeneration).cuda()
    ids = torch.randint(1, VOCAB, (2, 20), device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step = model(ids, decoder_input_ids=ids[:, :3], use_cache=True)
        step = model(ids, decoder_input_ids=ids[:, :1], cache=step.cache, use_cache=True)
        labels = torch.zeros(2, dtype=torch.long, device="cuda")
        build(FastformerForSequenceClassification).cuda()(ids, token_type_ids=torch.zeros_like(ids), labels=labels)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_value_checks_run_on_every_device_inside_value_checks(build):
    model = build(FastformerModel)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        model(torch.tensor([[1, VOCAB]]))
    with pytest.raises(ValueError, match="`token_type_ids` holds 2"):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 2]]))
    meta_model = build(FastformerModel).to("meta")
    with pytest.raises(Exception, match="meta"):  # a value read, which a tensor on "meta" cannot give
        meta_model(meta(torch.tensor([[1, VOCAB]])))


def test_by_default_no_value_is_read_on_any_device(build):
    """Off by default, on the CPU as on the "meta" stand-in for an accelerator: a bad id or token type fails inside
    torch, as in BERT."""
    model = build(FastformerModel)
    with pytest.raises(IndexError):
        model(torch.tensor([[1, VOCAB]]))
    with pytest.raises(IndexError):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[0, 2]]))


def test_empty_decoder_input_is_named(build):
    model = build(FastformerForConditionalGeneration)
    with pytest.raises(ValueError, match=r"`decoder_input_ids` has no token \(seq_len 0\)"):
        model(IDS, decoder_input_ids=torch.ones(2, 0, dtype=torch.long))
    with pytest.raises(ValueError, match=r"`decoder_inputs_embeds` has no token"):
        model(IDS, decoder_inputs_embeds=torch.ones(2, 0, HIDDEN))


@pytest.mark.parametrize("model_class", [FastformerModel, FastformerForCausalLM])
def test_position_ids_past_the_table_or_of_another_shape_are_named(build, model_class):
    model = build(model_class)
    with pytest.raises(ValueError, match=r"`position_ids` holds 64, outside \[0, 64\)"):
        model(IDS, position_ids=torch.arange(58, 65).expand(2, -1))
    with pytest.raises(ValueError, match=r"`position_ids` holds -1"):
        model(IDS, position_ids=torch.arange(-1, 6).expand(2, -1))
    with pytest.raises(ValueError, match=r"`position_ids` must have shape \(batch, seq_len\) = \(2, 7\) or \(1, 7\)"):
        model(IDS, position_ids=torch.arange(6)[None])
    shared = model(IDS, position_ids=torch.arange(7)[None])[0]
    torch.testing.assert_close(shared, model(IDS)[0])  # (1, seq_len) serves every row


def test_by_default_every_column_counts_against_the_positions(build):
    """Positions count real tokens, but whether a row's real tokens fit would take its values: a batch of more
    columns than positions is refused, padded or not, on every device."""
    model = build(FastformerModel)
    ids = torch.randint(1, VOCAB, (2, 70), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[:, :10] = 0  # 60 real tokens, 70 columns, 64 positions
    with pytest.raises(ValueError, match="`input_ids` sequence reaches more than 64 positions"):
        model(ids, attention_mask=mask)
    padded = model(ids[:, 6:], attention_mask=mask[:, 6:]).last_hidden_state[:, 4:]  # 64 columns fit
    torch.testing.assert_close(padded, model(ids[:, 10:]).last_hidden_state, rtol=1e-5, atol=1e-5)


def test_the_over_length_error_names_inputs_embeds_when_they_were_passed(build):
    model = build(FastformerModel)
    with pytest.raises(ValueError, match="The `inputs_embeds` sequence reaches more than 64 positions"):
        model(inputs_embeds=torch.randn(1, 65, HIDDEN))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_integer_class_labels_of_any_width_work(build, dtype):
    """numpy and pandas often give int32 labels: they train as torch.long ones."""
    model = build(FastformerForSequenceClassification, num_labels=3, problem_type="single_label_classification")
    labels = torch.tensor([2, 0])
    expected = model(IDS, labels=labels).loss
    torch.testing.assert_close(model(IDS, labels=labels.to(dtype)).loss, expected)


@pytest.mark.parametrize("model_class", [FastformerForMaskedLM, FastformerForCausalLM])
def test_int32_token_labels_work(build, model_class):
    model = build(model_class)
    torch.testing.assert_close(model(IDS, labels=IDS.int()).loss, model(IDS, labels=IDS).loss)


def test_a_head_count_changed_on_the_config_after_creation_is_refused_by_the_model(tiny_config):
    config = tiny_config()
    config.num_attention_heads = 5  # does not divide hidden_size 32; only the field's own rule runs on assignment
    with pytest.raises(
        ValueError, match=r"hidden size \(32\) is not a multiple of the number of attention heads \(5\)"
    ):
        FastformerModel(config)
