"""scripts/frozen_encoder.py: a frozen encoder stays fixed (its word embeddings too), and its output, computed once
per source by CachedEncoderStates, gives the training loss and the generated tokens of the end-to-end model."""

import datasets
import numpy
import pytest
import torch
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    BertConfig,
    DataCollatorForSeq2Seq,
    EncoderDecoderConfig,
    EncoderDecoderModel,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)

from fastformer import FastformerForConditionalGeneration
from frozen_encoder import CachedEncoderStates, freeze_encoder

VOCAB, PAD, START, EOS = 61, 0, 1, 2


@pytest.fixture(scope="module")
def tiny_config(tiny_config):
    return lambda **overrides: tiny_config(
        **{
            **dict(
                vocab_size=VOCAB,
                pad_token_id=PAD,
                bos_token_id=START,
                decoder_start_token_id=START,
                eos_token_id=EOS,
                hidden_dropout_prob=0.1,
            ),
            **overrides,
        }
    )


class Tokenizer:
    """What DataCollatorForSeq2Seq reads of a tokenizer: the padding of token ids and labels."""

    pad_token_id, padding_side = PAD, "right"

    def pad(self, features, return_tensors="pt", **kwargs):
        length = max(len(feature["input_ids"]) for feature in features)
        ids = [feature["input_ids"] + [PAD] * (length - len(feature["input_ids"])) for feature in features]
        mask = [[1] * len(feature["input_ids"]) + [0] * (length - len(feature["input_ids"])) for feature in features]
        return {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}


def articles(count=6, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(4, 12, (count,), generator=generator).tolist()
    return [
        {
            "input_ids": torch.randint(3, VOCAB, (n,), generator=generator).tolist(),
            "labels": torch.randint(3, VOCAB, (4,), generator=generator).tolist() + [EOS],
        }
        for n in lengths
    ]


def collators(model):
    plain = DataCollatorForSeq2Seq(Tokenizer(), model=model, label_pad_token_id=-100)
    return plain, CachedEncoderStates(plain, model)


def test_cached_states_give_the_loss_of_the_end_to_end_forward_with_an_eval_mode_encoder(build):
    model = build(FastformerForConditionalGeneration, share_layers=False)
    freeze_encoder(model)
    plain, cached = collators(model)
    batch = articles()  # lengths differ: padding in every batch
    with torch.no_grad():
        end_to_end = model(**plain(batch)).loss
        model.get_decoder().train()  # a training step's decoder; the cache computes the encoder in eval mode
        torch.manual_seed(3)
        with_cache = model(**cached(batch)).loss
        model.get_encoder().eval()
        torch.manual_seed(3)
        decoder_only_dropout = model(**plain(batch)).loss
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**cached(batch)).loss, end_to_end, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(with_cache, decoder_only_dropout, rtol=1e-6, atol=1e-6)
    assert len(cached.states) == len(batch)  # one entry per source, real tokens only
    assert [tuple(state.shape) for state in cached.states.values()] == [(len(a["input_ids"]), 32) for a in batch]


def test_sources_encoded_up_front_in_sorted_batches_get_the_states_of_collated_batches(build):
    model = build(FastformerForConditionalGeneration, share_layers=False)
    freeze_encoder(model)
    batch = articles(count=7, seed=1)
    plain, lazy = collators(model)
    sources = [article["input_ids"] for article in batch]
    up_front = CachedEncoderStates(plain, model, sources + sources[:2], batch_size=3)  # a repeat is encoded once
    model.get_encoder().train()
    expected, found = lazy(batch), up_front(batch[2:5])  # the first call encodes all 7, in sorted batches of 3
    assert up_front.states.keys() == lazy.states.keys() and not up_front.sources
    for key, states in lazy.states.items():
        torch.testing.assert_close(up_front.states[key], states, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(
        found["encoder_outputs"].last_hidden_state, lazy(batch[2:5])["encoder_outputs"].last_hidden_state
    )
    assert expected["encoder_outputs"].last_hidden_state.shape[:2] == expected["input_ids"].shape
    assert model.get_encoder().training  # the encoder's mode is as it was


def test_cached_states_serve_bert2bert_alike():
    """The same collator and freezing for transformers' EncoderDecoderModel (the BERT2BERT rows)."""
    bert = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
    config = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True)
    )
    config.update(dict(pad_token_id=PAD, decoder_start_token_id=START, eos_token_id=EOS))
    torch.manual_seed(0)
    model = EncoderDecoderModel(config).eval()
    freeze_encoder(model)
    assert not any(parameter.requires_grad for parameter in model.encoder.parameters())
    plain, cached = collators(model)
    batch = articles()
    with torch.no_grad():
        torch.testing.assert_close(model(**cached(batch)).loss, model(**plain(batch)).loss, rtol=1e-6, atol=1e-6)


def test_freezing_unties_the_embeddings_and_training_leaves_every_encoder_parameter_as_it_was(build, tmp_path):
    model = build(FastformerForConditionalGeneration).train()
    assert model.get_input_embeddings().weight is model.lm_head.weight  # one matrix, before freezing
    freeze_encoder(model)
    assert model.config.tie_encoder_embeddings is False
    assert model.get_input_embeddings().weight is not model.lm_head.weight
    assert "model.encoder.embeddings.word_embeddings.weight" not in model.all_tied_weights_keys.values()
    assert model.get_decoder().embeddings.word_embeddings.weight is model.lm_head.weight  # the decoder's stay tied
    encoder = {name: p.clone() for name, p in model.get_encoder().named_parameters()}
    head = model.lm_head.weight.clone()
    _, cached = collators(model)
    train = datasets.Dataset.from_list(articles(8))
    args = Seq2SeqTrainingArguments(
        tmp_path / "run",
        use_cpu=True,
        per_device_train_batch_size=4,
        num_train_epochs=3,
        learning_rate=1e-2,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    Seq2SeqTrainer(model=model, args=args, train_dataset=train, data_collator=cached).train()
    for name, parameter in model.get_encoder().named_parameters():
        assert torch.equal(parameter, encoder[name]), name
    assert not torch.equal(model.lm_head.weight, head)
    assert len(cached.states) == 8  # each source encoded once in 3 epochs
    model.save_pretrained(tmp_path / "saved")  # reloaded, the encoder keeps its matrix and the decoder its own
    reloaded = FastformerForConditionalGeneration.from_pretrained(tmp_path / "saved")
    assert torch.equal(reloaded.get_input_embeddings().weight, encoder["embeddings.word_embeddings.weight"])
    assert torch.equal(reloaded.lm_head.weight, model.lm_head.weight)
    assert reloaded.get_decoder().embeddings.word_embeddings.weight is reloaded.lm_head.weight


def test_the_encoders_top_layers_can_train_while_the_rest_stays_frozen(build):
    model = build(FastformerForConditionalGeneration, share_layers=False, num_hidden_layers=3).train()
    freeze_encoder(model, train_top_layers=1)
    encoder = model.get_encoder()
    trainable = {name for name, p in encoder.named_parameters() if p.requires_grad}
    assert trainable and all(name.startswith("layers.2.") for name in trainable)
    assert {name for name, _ in encoder.layers[2].named_parameters()} == {
        name[len("layers.2.") :] for name in trainable
    }
    before = {name: p.clone() for name, p in encoder.named_parameters()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    plain, _ = collators(model)
    for _ in range(2):
        model(**plain(articles())).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    for name, parameter in encoder.named_parameters():
        assert torch.equal(parameter, before[name]) != (name in trainable), name
    with pytest.raises(ValueError, match="between 0 and the encoder's 3 layers"):
        freeze_encoder(build(FastformerForConditionalGeneration, share_layers=False, num_hidden_layers=3), 4)
    with pytest.raises(ValueError, match="shared layers"):
        freeze_encoder(build(FastformerForConditionalGeneration, share_layers=True, num_hidden_layers=3), 1)


def test_generation_from_cached_states_gives_the_end_to_end_tokens(build):
    model = build(FastformerForConditionalGeneration, initializer_range=0.2)
    freeze_encoder(model)
    _, cached = collators(model)
    batch = articles(seed=1)
    with torch.no_grad():
        inputs = {key: value for key, value in cached(batch).items() if key not in ("labels", "decoder_input_ids")}
        expected = model.generate(**{key: inputs[key] for key in ("input_ids", "attention_mask")}, max_new_tokens=8)
        assert torch.equal(model.generate(**inputs, max_new_tokens=8, num_beams=1), expected)
        beams = model.generate(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], num_beams=3, max_new_tokens=8
        )
        assert torch.equal(model.generate(**inputs, max_new_tokens=8, num_beams=3), beams)


def test_trainer_predicts_from_cached_states_with_beams_as_end_to_end(build, tmp_path):
    """run_summarization.py's trainer generates with beams and computes the loss from one cached batch: generate()
    expands given encoder_outputs in place, which broke the loss forward after it (batch 6 against 18 rows)."""
    from scripts.run_summarization import SummarizationTrainer  # noqa: PLC0415

    model = build(FastformerForConditionalGeneration, initializer_range=0.2).eval()
    freeze_encoder(model)
    plain, cached = collators(model)
    test = datasets.Dataset.from_list(articles(6, seed=2))
    args = Seq2SeqTrainingArguments(
        tmp_path / "run",
        use_cpu=True,
        per_device_eval_batch_size=6,
        predict_with_generate=True,
        generation_num_beams=3,
        generation_max_length=8,
        report_to="none",
        disable_tqdm=True,
        remove_unused_columns=False,
    )
    found = [
        SummarizationTrainer(model=model, args=args, data_collator=collator).predict(test)
        for collator in (plain, cached)
    ]
    assert numpy.array_equal(found[1].predictions, found[0].predictions)
    assert found[1].metrics["test_loss"] == pytest.approx(found[0].metrics["test_loss"], rel=1e-6)


def test_freezing_refuses_an_encoder_that_shares_with_the_decoder_and_freezes_nothing(build):
    model = build(FastformerForConditionalGeneration)
    model.get_decoder().layers[0].feed_forward = model.get_encoder().layers[0].feed_forward  # shared by hand
    with pytest.raises(ValueError, match="are also the decoder's: a frozen encoder would still change"):
        freeze_encoder(model)
    bart = BartForConditionalGeneration(
        BartConfig(
            vocab_size=VOCAB,
            d_model=16,
            encoder_layers=1,
            decoder_layers=1,
            encoder_attention_heads=2,
            decoder_attention_heads=2,
            encoder_ffn_dim=32,
            decoder_ffn_dim=32,
        )
    )
    with pytest.raises(ValueError, match=r"The encoder's embed_tokens.weight are also the decoder's"):
        freeze_encoder(bart)  # its shared embeddings: its checkpoints tie them again on loading
    assert all(parameter.requires_grad for parameter in bart.parameters())  # refused before freezing any
