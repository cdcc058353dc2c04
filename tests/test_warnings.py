"""A user's everyday calls emit no deprecation warning: neither a Python DeprecationWarning/FutureWarning nor a
transformers log message about something deprecated. (The whole suite also runs with RuntimeWarning as an
error: pyproject.toml's filterwarnings.)"""

import logging
import warnings

import datasets
import torch
import transformers
from transformers import AutoModel, AutoModelForSeq2SeqLM, Trainer, TrainingArguments, pipeline

from fastformer import (
    FastformerConfig,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)

VOCAB = 99


def everyday_use(tmp_path, tokenizer_path):
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=64,
        num_labels=3,
        pad_token_id=0,
        decoder_start_token_id=1,
        eos_token_id=2,
    )
    config = FastformerConfig(**settings)
    ids = torch.randint(3, VOCAB, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, 12:] = 0
    for model_class in (FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM):
        model = model_class(config)
        model(ids, attention_mask=mask, output_attentions=True, output_hidden_states=True)
        model.save_pretrained(tmp_path / model_class.__name__)
    AutoModel.from_pretrained(tmp_path / "FastformerModel")
    FastformerForSequenceClassification(config)(ids, attention_mask=mask, labels=torch.tensor([0, 2])).loss.backward()
    FastformerForMaskedLM(config)(ids, labels=ids).loss.backward()

    seq2seq = FastformerForConditionalGeneration(config)
    seq2seq(ids, attention_mask=mask, labels=ids[:, :5]).loss.backward()
    seq2seq.eval().generate(ids, attention_mask=mask, max_new_tokens=4)
    seq2seq.generate(ids, attention_mask=mask, max_new_tokens=4, num_beams=2)
    seq2seq.save_pretrained(tmp_path / "seq2seq")
    AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "seq2seq")
    FastformerForCausalLM(FastformerConfig(**settings)).eval().generate(ids[:1], max_new_tokens=4, do_sample=True)

    FastformerModel(FastformerConfig(**{**settings, "vocab_size": 30522})).save_pretrained(tmp_path / "bert-vocab")
    feature_extraction = pipeline("feature-extraction", model=tmp_path / "bert-vocab", tokenizer=str(tokenizer_path))
    feature_extraction("a short text")

    train = datasets.Dataset.from_dict({"input_ids": ids.tolist(), "labels": [0, 1]})
    args = TrainingArguments(
        tmp_path / "trainer",
        use_cpu=True,
        max_steps=2,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
    )
    Trainer(model=FastformerForSequenceClassification(config), args=args, train_dataset=train).train()


def test_everyday_use_emits_no_deprecation_warning(tmp_path, tokenizer_path, caplog):
    transformers.logging.enable_propagation()
    try:
        with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
            warnings.simplefilter("always")
            everyday_use(tmp_path, tokenizer_path)
    finally:
        transformers.logging.disable_propagation()
    deprecations = [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in caught
        if issubclass(w.category, (DeprecationWarning, FutureWarning, PendingDeprecationWarning))
    ]
    assert not deprecations, "\n".join(deprecations)
    logged = [record.getMessage() for record in caplog.records if "deprecat" in record.getMessage().lower()]
    assert not logged, "\n".join(logged)
