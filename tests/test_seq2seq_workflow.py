"""The generation models in the workflows users run: Seq2SeqTrainer with generation and ROUGE on real
article -> headline pairs, summarizing from a saved checkpoint, warm starts between encoder and seq2seq
checkpoints, the text-generation pipeline, and the Auto classes."""

import functools
import math

import datasets
import numpy as np
import pytest
import torch
from rouge_score import rouge_scorer, scoring
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EvalPrediction,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    pipeline,
)

from fastformer import (
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)

SOURCE_LENGTH, TARGET_LENGTH, GENERATION_MAX_LENGTH = 48, 16, 12
ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]
TEXTS = ["a short text.", "a longer text about additive attention."]


@pytest.fixture(scope="module")
def tiny_config(tiny_config, tokenizer_fields):
    # The decoder starts from [CLS] and stops at [SEP], as the tokenizer wraps a text (tokenizer_fields). With the
    # default initializer_range (0.02) and tied embeddings, an untrained decoder mostly repeats its input token
    # ([CLS], then nothing to decode); larger random weights make the generated tokens depend on the input.
    # Dropout on (FastformerConfig's default), as Seq2SeqTrainer trains for a user.
    return functools.partial(
        tiny_config, **tokenizer_fields, intermediate_size=64, initializer_range=0.2, hidden_dropout_prob=0.2
    )


@pytest.fixture(scope="module")
def headlines(tokenizer, repo_root, tmp_path_factory):
    """16 training and 8 validation pairs: the article's ids as input, the headline's ids then [SEP] as labels
    (without the leading [CLS]: that is the decoder start token, which the model does not predict)."""
    files = {split: str(repo_root / "data" / "news_headlines" / f"{split}.jsonl") for split in ("train", "validation")}
    raw = datasets.load_dataset("json", data_files=files, cache_dir=str(tmp_path_factory.mktemp("datasets")))

    def tokenize(batch):
        features = tokenizer(batch["document"], max_length=SOURCE_LENGTH, truncation=True)
        targets = tokenizer(batch["summary"], max_length=TARGET_LENGTH + 1, truncation=True)["input_ids"]
        features["labels"] = [ids[1:] for ids in targets]
        return features

    columns = raw["train"].column_names
    return {
        "train": raw["train"].select(range(16)).map(tokenize, batched=True, remove_columns=columns),
        "validation": raw["validation"].select(range(8)).map(tokenize, batched=True, remove_columns=columns),
        # two articles and a headline: a batch of them carries padding
        "texts": raw["validation"]["document"][:2] + raw["validation"]["summary"][2:3],
    }


def rouge_metrics(tokenizer):
    """compute_metrics for Seq2SeqTrainer: ROUGE F-measures in percent and the mean generated length."""
    scorer = rouge_scorer.RougeScorer(ROUGE_TYPES, use_stemmer=True)

    def compute_metrics(prediction):
        predictions, labels = (
            np.where(ids != -100, ids, tokenizer.pad_token_id) for ids in (prediction.predictions, prediction.label_ids)
        )
        aggregator = scoring.BootstrapAggregator()
        for target, generated in zip(
            tokenizer.batch_decode(labels, skip_special_tokens=True),
            tokenizer.batch_decode(predictions, skip_special_tokens=True),
        ):
            aggregator.add_scores(scorer.score(target, generated))
        metrics = {name: 100 * score.mid.fmeasure for name, score in aggregator.aggregate().items()}
        metrics["gen_len"] = float(np.mean(np.count_nonzero(predictions != tokenizer.pad_token_id, axis=1)))
        return metrics

    return compute_metrics


def test_seq2seq_trainer_trains_and_evaluates_with_generate(build, tmp_path, tokenizer, headlines):
    model = build(FastformerForConditionalGeneration).train()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        max_steps=4,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        learning_rate=1e-2,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        predict_with_generate=True,
        generation_max_length=GENERATION_MAX_LENGTH,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=headlines["train"],
        eval_dataset=headlines["validation"],
        data_collator=collator,
        processing_class=tokenizer,
        compute_metrics=rouge_metrics(tokenizer),
    )
    result = trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert result.global_step == 4 and len(losses) == 4 and all(map(math.isfinite, losses + [result.training_loss]))
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p.detach(), before[name])]
    # encoder, cross-attention and decoder all learn; not the token-type table: single texts are all type 0, whose
    # row stays zero
    assert unchanged == ["model.encoder.embeddings.token_type_embeddings.weight"]

    metrics = trainer.evaluate()
    for name in ROUGE_TYPES:
        score = metrics[f"eval_{name}"]
        assert isinstance(score, float) and math.isfinite(score) and 0 <= score <= 100, name
    assert metrics["eval_gen_len"] > 0 and math.isfinite(metrics["eval_loss"])
    # four steps teach no headlines (ROUGE 0 is expected): the metric itself gives 100 for the labels
    predicted = trainer.predict(headlines["validation"])
    perfect = trainer.compute_metrics(EvalPrediction(predicted.label_ids, predicted.label_ids))
    assert all(perfect[name] == pytest.approx(100) for name in ROUGE_TYPES)

    # the predictions are model.generate's tokens (start token first, at most generation_max_length of them),
    # which the trainer pads to model.generation_config.max_length; not the teacher-forced argmax
    predictions = predicted.predictions
    batch = collator(list(headlines["validation"]))
    with torch.no_grad():
        generated = model.eval().generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_length=GENERATION_MAX_LENGTH
        )
    assert generated.shape[1] <= GENERATION_MAX_LENGTH
    assert (generated[:, 0] == tokenizer.cls_token_id).all()
    padding = torch.full((len(generated), predictions.shape[1] - generated.shape[1]), tokenizer.pad_token_id)
    np.testing.assert_array_equal(predictions, torch.cat([generated, padding], dim=1).numpy())


def test_loss_is_cross_entropy_of_the_labels_without_a_second_shift(build, tokenizer, headlines):
    model = build(FastformerForConditionalGeneration)
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)([headlines["train"][i] for i in range(4)])
    labels = batch["labels"]
    assert (labels == -100).any()  # padded labels, so ignore_index is exercised
    # the collator asks the model for the decoder inputs: start token, then the labels shifted right
    start = torch.full((len(labels), 1), tokenizer.cls_token_id)
    decoder_inputs = torch.cat([start, labels[:, :-1]], dim=1)
    decoder_inputs[decoder_inputs == -100] = tokenizer.pad_token_id
    assert torch.equal(batch["decoder_input_ids"], decoder_inputs)
    with torch.no_grad():
        output = model(**batch)
        labels_only = model(batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels)
    logits = output.logits
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten())
    torch.testing.assert_close(output.loss, expected)
    torch.testing.assert_close(labels_only.loss, expected)
    # the causal-LM loss would shift the labels once more: a different number
    shifted_twice = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    assert not torch.allclose(shifted_twice, expected)


def test_summarization_pipeline_on_a_saved_checkpoint(build, tmp_path, tokenizer, headlines):
    # transformers 5 removed its summarization pipeline; a saved checkpoint ships ours (config custom_pipelines)
    model = build(FastformerForConditionalGeneration)
    model.generation_config.max_new_tokens = 6
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    summarize = pipeline("summarization", model=str(tmp_path), trust_remote_code=True)
    assert type(summarize.model) is FastformerForConditionalGeneration
    texts = headlines["texts"]
    results = summarize(texts)
    assert len({result["summary_text"] for result in results}) == len(texts)
    for text, result in zip(texts, results):
        for settings in [{}, {"num_beams": 3}]:
            # truncated to the encoder's positions, the saved generation config, special tokens dropped
            inputs = tokenizer(
                text, max_length=model.config.max_position_embeddings, truncation=True, return_tensors="pt"
            )
            with torch.no_grad():
                alone = model.generate(**inputs, **settings)
            summary = result["summary_text"] if not settings else summarize(text, **settings)[0]["summary_text"]
            assert alone.shape[1] > 1 and summary
            assert summary == tokenizer.decode(alone[0], skip_special_tokens=True).strip()
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("summarization", model=str(tmp_path))


def encoder_output(model, inputs):
    with torch.no_grad():
        encoder = model.get_encoder() if isinstance(model, FastformerForConditionalGeneration) else model.base_model
        return encoder(**inputs).last_hidden_state


def saved_weights(model, prefix):
    """The names of `model`'s weights under `prefix` as a checkpoint holds them: without tied copies, and those of
    an encoder-decoder under the names it saves them by (`fastformer.`, `decoder.`)."""
    names = set(model.state_dict()) - set(model.all_tied_weights_keys)
    names = {name.replace("model.encoder.", "fastformer.").replace("model.decoder.", "decoder.") for name in names}
    return {name for name in names if name.startswith(prefix)}


# the head an encoder checkpoint lacks, as weight-name prefixes
NEW_HEAD = {FastformerModel: ("pooler.",), FastformerForSequenceClassification: ("fastformer.pooler.", "classifier.")}


@pytest.mark.parametrize("encoder_class", NEW_HEAD, ids=lambda cls: cls.__name__)
def test_seq2seq_checkpoint_warm_starts_encoder_models(build, tmp_path, tokenizer, encoder_class):
    seq2seq = build(FastformerForConditionalGeneration)
    seq2seq.save_pretrained(tmp_path)
    model, info = encoder_class.from_pretrained(tmp_path, output_loading_info=True)
    # the decoder is left over; the LM head is tied to the encoder embeddings, so not in the checkpoint
    assert info["unexpected_keys"] == saved_weights(seq2seq, "decoder.")
    assert "lm_head.weight" not in info["unexpected_keys"]
    assert info["missing_keys"] and all(name.startswith(NEW_HEAD[encoder_class]) for name in info["missing_keys"])
    assert not info["mismatched_keys"]
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert torch.equal(encoder_output(model, inputs), encoder_output(seq2seq, inputs))


def test_masked_lm_checkpoint_warm_starts_the_seq2seq_encoder(build, tmp_path, tokenizer):
    masked_lm = build(FastformerForMaskedLM)
    masked_lm.save_pretrained(tmp_path)
    seq2seq, info = FastformerForConditionalGeneration.from_pretrained(tmp_path, output_loading_info=True)
    assert info["missing_keys"] == {f"model.{name}" for name in saved_weights(seq2seq, "decoder.")}
    assert info["unexpected_keys"] == saved_weights(masked_lm, "lm_head.")
    inputs = tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert torch.equal(encoder_output(seq2seq, inputs), encoder_output(masked_lm, inputs))
    # decoder embeddings and LM head are tied to the loaded encoder embeddings, not left at their init
    embeddings = masked_lm.fastformer.embeddings.word_embeddings.weight
    assert torch.equal(seq2seq.lm_head.weight, embeddings)
    assert torch.equal(seq2seq.get_decoder().embeddings.word_embeddings.weight, embeddings)


def test_text_generation_pipeline_on_causal_lm(build, tmp_path, tokenizer):
    model = build(FastformerForCausalLM)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path))
    assert type(generator.model) is FastformerForCausalLM
    prompt = "additive attention pools the whole sequence"
    result = generator(prompt, max_new_tokens=5, do_sample=False)
    # the pipeline tokenizes with the tokenizer's defaults ([CLS] ... [SEP] here) and returns the prompt, then the
    # new tokens decoded without special tokens
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] == inputs["input_ids"].shape[1] + 5
    new_text = tokenizer.decode(generated[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert new_text
    assert result == [{"generated_text": prompt + new_text}]


@pytest.mark.parametrize(
    "auto_class, model_class, overrides",
    [
        (AutoModelForSeq2SeqLM, FastformerForConditionalGeneration, {"cross_attention_type": "softmax"}),
        (AutoModelForSeq2SeqLM, FastformerForConditionalGeneration, {"cross_attention_type": "additive"}),
        (AutoModelForCausalLM, FastformerForCausalLM, {}),
    ],
    ids=["seq2seq-softmax", "seq2seq-additive", "causal-lm"],
)
def test_auto_class_round_trip_is_bit_identical(build, tmp_path, tokenizer, auto_class, model_class, overrides):
    model = build(model_class, **overrides)
    model.save_pretrained(tmp_path)
    loaded = auto_class.from_pretrained(tmp_path)
    assert type(loaded) is model_class and not loaded.training
    inputs = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    if model_class is FastformerForConditionalGeneration:
        inputs["decoder_input_ids"] = tokenizer(TEXTS[::-1], padding=True, return_tensors="pt").input_ids[:, :5]
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
