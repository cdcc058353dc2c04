"""Numbers stay finite and close to float32: half-precision weights, autocast, long sequences, extreme logits,
padding-only rows, fp16 training with loss scaling; and property-based checks (hypothesis) of padding and
batch-order invariance for the encoder and for generation."""

import functools

import datasets
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import Trainer, TrainingArguments

from fastformer import (
    FastformerForConditionalGeneration,
    FastformerForSequenceClassification,
    FastformerModel,
)

VOCAB = 99
HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
# relative error (norm of the difference over the norm of the float32 output), largest measured on these tiny
# models over the cases below: bf16 weights 5.2e-3, fp16 weights 6.6e-4, autocast bf16 3.8e-4 (the residual
# stream and LayerNorms stay float32), autocast fp16 4.8e-5; the bounds are about 4x that
WEIGHTS_BOUND = {"bf16": 2e-2, "fp16": 3e-3}
AUTOCAST_BOUND = {"bf16": 1.5e-3, "fp16": 2e-4}


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return functools.partial(
        tiny_config, vocab_size=VOCAB, max_position_embeddings=16384, share_layers=False, share_query_value=False
    )


def encoder(build, extreme=False):
    model = build(FastformerModel)
    if extreme:  # saturated softmaxes (pooling logits in the hundreds) and large queries, keys and values
        with torch.no_grad():
            for layer in model.layers:
                attention = layer.attention
                attention.query_weight.mul_(1000)
                attention.key_weight.mul_(1000)
                for linear in (attention.query, attention.key, attention.value):
                    linear.weight.mul_(5)
    return model


def relative_error(output, reference):
    return ((output.double() - reference.double()).norm() / reference.double().norm()).item()


def inputs(length, batch=2):
    ids = torch.randint(1, VOCAB, (batch, length), generator=torch.Generator().manual_seed(length))
    mask = torch.ones_like(ids)
    mask[1, length // 2 :] = 0  # right padding
    if batch > 2:
        mask[2:] = 0  # rows of padding only
    return ids, mask


@pytest.mark.parametrize("extreme", [False, True], ids=["normal", "extreme-logits"])
@pytest.mark.parametrize("length", [64, 16384])
@pytest.mark.parametrize("half", HALF)
def test_half_precision_weights_and_autocast_stay_close_to_float32(build, half, length, extreme):
    model = encoder(build, extreme)
    ids, mask = inputs(length)
    with torch.no_grad():
        output = model(ids, attention_mask=mask, output_attentions=True)
        reference = output.last_hidden_state
        # extreme: some pooling puts almost all its weight on a single token
        assert (max(weights.max() for weights in output.attentions) > 0.99) == extreme
        with torch.autocast("cpu", dtype=HALF[half]):
            autocast = model(ids, attention_mask=mask).last_hidden_state
        low = model.to(HALF[half])(ids, attention_mask=mask).last_hidden_state
    assert low.dtype == HALF[half] and torch.isfinite(low).all() and torch.isfinite(autocast).all()
    assert relative_error(low, reference) < WEIGHTS_BOUND[half]
    assert relative_error(autocast, reference) < AUTOCAST_BOUND[half]


@pytest.mark.parametrize("half", HALF)
def test_padding_only_rows_are_finite_in_half_precision_with_gradients(build, half):
    model = encoder(build, extreme=True).to(HALF[half]).train()
    ids, mask = inputs(32, batch=3)  # the third row is all padding
    output = model(ids, attention_mask=mask)
    (output.last_hidden_state.float().sum() + output.pooler_output.float().sum()).backward()
    assert torch.isfinite(output.last_hidden_state).all() and torch.isfinite(output.pooler_output).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_fp16_training_with_loss_scaling_keeps_gradients_finite(build):
    """The loop the Trainer runs with fp16=True on a GPU (autocast + torch.amp.GradScaler). On CPU the Trainer
    does not enable fp16 autocast or a scaler (accelerate's native_amp is False there), so the loop is driven
    directly here."""
    model = build(FastformerForSequenceClassification, num_labels=3, max_position_embeddings=64).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    generator = torch.Generator().manual_seed(0)
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(5):
        ids = torch.randint(1, VOCAB, (8, 40), generator=generator)
        mask = (torch.arange(40) < torch.randint(1, 41, (8, 1), generator=generator)).long()
        labels = torch.randint(0, 3, (8,), generator=generator)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(ids, attention_mask=mask, labels=labels).loss
        assert torch.isfinite(loss)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert scaler.get_scale() >= 2.0**15  # no step was skipped for an overflow more than once
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_trainer_bf16_on_cpu_gives_finite_loss_and_weights(build, tmp_path):
    model = build(FastformerForSequenceClassification, num_labels=3, max_position_embeddings=64)
    generator = torch.Generator().manual_seed(0)
    train = datasets.Dataset.from_dict(
        {
            "input_ids": torch.randint(1, VOCAB, (32, 24), generator=generator).tolist(),
            "labels": torch.randint(0, 3, (32,), generator=generator).tolist(),
        }
    )
    args = TrainingArguments(
        tmp_path,
        bf16=True,
        use_cpu=True,
        per_device_train_batch_size=8,
        max_steps=4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        learning_rate=1e-3,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    assert trainer.accelerator.native_amp  # bf16 autocast is really on
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    assert all(torch.isfinite(p).all() for p in model.parameters())


# ---- property-based: padding and batch order never change a sequence's result ------------------------------

PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def padded_batches(draw):
    """A batch of 1-4 sequences, 0-24 tokens each, padded to a common width on the left, on the right, or
    with padding scattered anywhere; plus the encoder's shape and the dtype."""
    lengths = draw(st.lists(st.integers(0, 24), min_size=1, max_size=4))
    width = max(max(lengths), 1) + draw(st.integers(0, 6))
    layout = draw(st.sampled_from(["left", "right", "scattered"]))
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (len(lengths), width), generator=generator)
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, n in enumerate(lengths):
        if layout == "left":
            mask[row, width - n :] = 1
        elif layout == "right":
            mask[row, :n] = 1
        else:
            mask[row, torch.randperm(width, generator=generator)[:n]] = 1
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    shares = draw(st.booleans())
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    return ids, mask, heads, shares, dtype, seed


@PROPERTY
@given(padded_batches())
def test_encoder_padding_and_batch_order_invariance(build, batch):
    ids, mask, heads, shares, dtype, seed = batch
    model = build(
        FastformerModel, seed=seed, num_attention_heads=heads, share_query_value=shares, max_position_embeddings=64
    ).to(dtype)
    with torch.no_grad():
        batched = model(ids, attention_mask=mask)
        assert torch.isfinite(batched.last_hidden_state).all() and torch.isfinite(batched.pooler_output).all()
        if dtype == torch.bfloat16:  # finiteness only: 8-bit mantissas make invariance a matter of rounding
            return
        tolerance = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-10)
        for row in range(ids.shape[0]):
            real = mask[row].bool()
            if not real.any():
                continue
            alone = model(ids[row, real][None])
            torch.testing.assert_close(batched.last_hidden_state[row, real], alone.last_hidden_state[0], **tolerance)
            torch.testing.assert_close(batched.pooler_output[row], alone.pooler_output[0], **tolerance)
        order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))
        shuffled = model(ids[order], attention_mask=mask[order])
        torch.testing.assert_close(shuffled.last_hidden_state, batched.last_hidden_state[order], **tolerance)


@st.composite
def source_batches(draw):
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=3))
    width = max(lengths)
    seed = draw(st.integers(0, 2**16))
    generator = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)  # pad_token_id 0
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n :] = torch.randint(3, VOCAB, (n,), generator=generator)
        mask[row, width - n :] = 1
    cross_attention = draw(st.sampled_from(["softmax", "additive"]))
    return ids, mask, cross_attention, seed


@PROPERTY
@given(source_batches())
def test_generation_padding_and_batch_order_invariance(build, batch):
    """Greedy generation, float64 (so that near-ties cannot flip an argmax): each source alone, in a padded
    batch and in a shuffled batch gives the same tokens and scores."""
    ids, mask, cross_attention, seed = batch
    model = build(
        FastformerForConditionalGeneration,
        seed=seed,
        max_position_embeddings=64,
        pad_token_id=0,
        decoder_start_token_id=1,
        eos_token_id=2,
        cross_attention_type=cross_attention,
    ).double()
    options = dict(max_new_tokens=6, do_sample=False, num_beams=1, output_scores=True, return_dict_in_generate=True)
    batched = model.generate(ids, attention_mask=mask, **options)
    scores = torch.stack(batched.scores, dim=1)  # (batch, steps, vocab)
    assert torch.isfinite(scores).all()
    for row in range(ids.shape[0]):
        alone = model.generate(ids[row, mask[row].bool()][None], **options)
        steps = alone.sequences.shape[1]
        assert torch.equal(batched.sequences[row, :steps], alone.sequences[0])
        torch.testing.assert_close(scores[row, : steps - 1], torch.stack(alone.scores, dim=1)[0])
    order = torch.randperm(ids.shape[0], generator=torch.Generator().manual_seed(seed))
    shuffled = model.generate(ids[order], attention_mask=mask[order], **options)
    assert torch.equal(shuffled.sequences, batched.sequences[order])
