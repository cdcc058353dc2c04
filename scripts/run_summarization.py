"""Fine-tune (or train from scratch) a Fastformer encoder-decoder for summarization, as transformers'
run_summarization.py.

With no data arguments it trains on the bundled news articles -> headlines subset (data/news_headlines).
Reports ROUGE-1/2/L/Lsum computed with rouge_score (offline) and the generation length, writes
eval_results.json / all_results.json, and saves a Hub-ready folder (weights, config, code for
trust_remote_code, tokenizer, generation config, model card). Any transformers seq2seq model type trains too
(--model_type bart) for comparisons.

    python scripts/run_summarization.py --output_dir runs/headlines --do_train --do_eval --predict_with_generate
"""

import logging
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import datasets
import numpy as np
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from fastformer.summarization import CachedEncoderStates, freeze_encoder, rouge
from fastformer.training import (
    SPLIT_FLAGS,
    DataArguments,
    ModelArguments,
    ModelCardTrainerMixin,
    dataset_name,
    fail,
    load_config,
    load_model,
    load_raw_datasets,
    load_tokenizer,
    padding,
    parse_args,
    publish,
    require_columns,
    setup_logging,
    tokenize_splits,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]  # the source checkout this script is part of
BUNDLED_TOKENIZER = REPO / "data" / "tokenizers" / "bert-base-uncased"
BUNDLED_DATA = REPO / "data" / "news_headlines"
BUNDLED = {split: BUNDLED_DATA / f"{split}.jsonl" for split in ("train", "validation", "test")}


@dataclass
class DataTrainingArguments(DataArguments):
    text_column: str | None = field(default=None, metadata={"help": "Input column (default: document)."})
    summary_column: str | None = field(default=None, metadata={"help": "Target column (default: summary)."})
    source_prefix: str | None = field(
        default=None, metadata={"help": "Text put before every input (e.g. 'summarize: ' for T5)."}
    )
    max_source_length: int = field(default=512, metadata={"help": "Longer inputs are truncated."})
    max_target_length: int = field(default=64, metadata={"help": "Longer training targets are truncated."})
    val_max_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Target length for evaluation and prediction, and generate's max_length there unless "
            "--generation_max_length is given (default: --max_target_length)."
        },
    )
    num_beams: int | None = field(
        default=None,
        metadata={
            "help": "Beams for generate in evaluation and prediction (default: --generation_num_beams, else the "
            "model's generation config)."
        },
    )
    length_penalty: float | None = field(
        default=None,
        metadata={"help": "Beam search's length penalty (> 1 favours longer outputs); saved in the generation config."},
    )
    min_target_length: int | None = field(
        default=None,
        metadata={
            "help": "Generate at least this many tokens in evaluation and prediction (min_new_tokens); saved in "
            "the generation config."
        },
    )
    no_repeat_ngram_size: int | None = field(
        default=None,
        metadata={"help": "Never generate an n-gram of this size twice; saved in the generation config."},
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop training after this many evaluations without improving --metric_for_best_model (needs "
            "--load_best_model_at_end, which keeps the best checkpoint)."
        },
    )
    ignore_pad_token_for_loss: bool = field(
        default=True, metadata={"help": "Leave the labels' padding out of the loss (label -100)."}
    )

    def __post_init__(self):
        if self.val_max_target_length is None:
            self.val_max_target_length = self.max_target_length


@dataclass
class SummarizationModelArguments(ModelArguments):
    freeze_encoder: bool = field(
        default=False,
        metadata={
            "help": "Train the decoder only (as the transformers legacy seq2seq examples' --freeze_encoder): the "
            "encoder stays as loaded, its word embeddings included (a Fastformer's encoder gets its own copy of the "
            "matrix it shared with the decoder). For an encoder-decoder warm-started from an encoder checkpoint: "
            "fine-tuning the encoder through the new, random cross-attention collapses its token representations "
            "(docs/RESULTS.md)."
        },
    )
    train_encoder_layers: int = field(
        default=0,
        metadata={
            "help": "With --freeze_encoder: the encoder's top layers that still train (e.g. once the decoder has "
            "settled, at a small learning rate)."
        },
    )
    cache_encoder_states: bool = field(
        default=False,
        metadata={
            "help": "With --freeze_encoder: compute the encoder's output once per article (eval mode: no encoder "
            "dropout in training either) and reuse it in every epoch, at evaluation and in generation, so a step "
            "costs the decoder only (fastformer.summarization.CachedEncoderStates)."
        },
    )


ARGUMENTS = (SummarizationModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments)


def label_pad_token_id(tokenizer, data_args) -> int:
    return -100 if data_args.ignore_pad_token_for_loss else tokenizer.pad_token_id


def tokenize(batch, *, tokenizer, data_args, text_column, summary_column, eos_token_id, max_target_length):
    """Inputs (after --source_prefix) cut to --max_source_length. Labels: the target ids cut to
    `max_target_length` - 1, then end-of-sequence; the decoder starts from decoder_start_token_id by itself.
    With --pad_to_max_length both are padded to their maximum length."""
    sources = [(data_args.source_prefix or "") + text for text in batch[text_column]]
    encoded = tokenizer(sources, max_length=data_args.max_source_length, padding=padding(data_args), truncation=True)
    targets = tokenizer(text_target=batch[summary_column], add_special_tokens=False)["input_ids"]
    labels = [ids[: max_target_length - 1] + [eos_token_id] for ids in targets]
    if data_args.pad_to_max_length:
        pad = label_pad_token_id(tokenizer, data_args)
        labels = [ids + [pad] * (max_target_length - len(ids)) for ids in labels]
    encoded["labels"] = labels
    return encoded


class SummarizationTrainer(ModelCardTrainerMixin, Seq2SeqTrainer):
    def prediction_step(self, model, inputs, *args, **kwargs):
        """As Seq2SeqTrainer's, but a batch's `encoder_outputs` (--cache_encoder_states) reach generate() as a copy:
        generate() expands them for beam search in place (transformers 5.24), and the loss forward that follows
        reads the same batch."""
        states = inputs.get("encoder_outputs")
        if states is None:
            return super().prediction_step(model, inputs, *args, **kwargs)
        generate = self.model.generate

        def generate_from_a_copy(*positional, encoder_outputs, **named):
            return generate(*positional, encoder_outputs=type(encoder_outputs)(**encoder_outputs), **named)

        self.model.generate = generate_from_a_copy
        try:
            return super().prediction_step(model, inputs, *args, **kwargs)
        finally:
            del self.model.generate


def main():
    model_args, data_args, training_args = parse_args(ARGUMENTS)
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED)
    columns = next(iter(raw.values())).column_names
    text_column = data_args.text_column or ("document" if "document" in columns else columns[0])
    summary_column = data_args.summary_column or ("summary" if "summary" in columns else columns[1 % len(columns)])
    for split in raw:
        require_columns(raw[split], [text_column], "--text_column")
        require_columns(raw[split], [summary_column], "--summary_column")

    # evaluation and prediction generate up to --val_max_target_length tokens, with --num_beams beams
    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.val_max_target_length
    if data_args.num_beams is not None:
        training_args.generation_num_beams = data_args.num_beams

    tokenizer = load_tokenizer(model_args, BUNDLED_TOKENIZER)
    max_length = max(data_args.max_source_length, data_args.max_target_length, training_args.generation_max_length)
    config = load_config(model_args, tokenizer, max_length)
    encoder_config = getattr(config, "encoder", config)  # EncoderDecoderModel (BERT2BERT) nests its encoder's
    positions = getattr(encoder_config, "max_position_embeddings", None)
    if positions is not None and data_args.max_source_length > positions:
        fail(
            f"--max_source_length {data_args.max_source_length} is longer than the model reads: "
            f"{positions} positions (max_position_embeddings)"
        )
    model = load_model(AutoModelForSeq2SeqLM, model_args, config)
    for name in ("decoder_start_token_id", "eos_token_id"):
        if getattr(model.config, name, None) is None:
            fail(f"the model config has no {name}: set it with --config_overrides {name}=ID")
    # the decoding flags go into the generation config, so the saved model generates as it was evaluated
    decoding = {
        "num_beams": data_args.num_beams,
        "length_penalty": data_args.length_penalty,
        "no_repeat_ngram_size": data_args.no_repeat_ngram_size,
        "min_new_tokens": data_args.min_target_length,
    }
    model.generation_config.update(**{name: value for name, value in decoding.items() if value is not None})
    if model_args.cache_encoder_states and model_args.train_encoder_layers:
        fail("--cache_encoder_states needs the whole encoder frozen: the states of layers in training go stale")
    if model_args.freeze_encoder:
        try:
            freeze_encoder(model, model_args.train_encoder_layers)
        except ValueError as error:
            fail(f"--freeze_encoder: {error}")
    elif model_args.cache_encoder_states:
        fail("--cache_encoder_states needs --freeze_encoder: the states of an encoder in training go stale")
    elif model_args.train_encoder_layers:
        fail("--train_encoder_layers needs --freeze_encoder (which freezes the layers below them)")
    if model_args.cache_encoder_states and training_args.dataloader_num_workers > 0:
        fail("--cache_encoder_states runs the encoder in the collator: use it with --dataloader_num_workers 0")
    callbacks = []
    if data_args.early_stopping_patience is not None:
        if not training_args.load_best_model_at_end:
            fail("--early_stopping_patience needs --load_best_model_at_end (and --metric_for_best_model)")
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=data_args.early_stopping_patience))

    preprocess = {
        split: partial(
            tokenize,
            tokenizer=tokenizer,
            data_args=data_args,
            text_column=text_column,
            summary_column=summary_column,
            eos_token_id=model.config.eos_token_id,
            max_target_length=data_args.max_target_length if split == "train" else data_args.val_max_target_length,
        )
        for split in SPLIT_FLAGS
    }
    prepared = tokenize_splits(raw, data_args, training_args, preprocess)

    def compute_metrics(prediction):
        predictions = np.where(prediction.predictions != -100, prediction.predictions, tokenizer.pad_token_id)
        labels = np.where(prediction.label_ids != -100, prediction.label_ids, tokenizer.pad_token_id)
        decoded = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        lengths = [np.count_nonzero(row != tokenizer.pad_token_id) for row in predictions]
        return {**rouge(decoded, references), "gen_len": float(np.mean(lengths))}

    pad = label_pad_token_id(tokenizer, data_args)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=pad)
    if model_args.cache_encoder_states:
        # every split's sources up front, sorted by length (a streamed split's as its batches come)
        sources = [
            ids for split in prepared.values() if isinstance(split, datasets.Dataset) for ids in split["input_ids"]
        ]
        collator = CachedEncoderStates(collator, model, sources, training_args.per_device_eval_batch_size)
    trainer = SummarizationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=collator,
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
        callbacks=callbacks,
    )

    eval_metrics = train_and_evaluate(trainer, prepared)

    if training_args.do_predict:
        output = trainer.predict(prepared["test"], metric_key_prefix="test")
        trainer.log_metrics("test", output.metrics)
        trainer.save_metrics("test", output.metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            predictions = np.where(output.predictions != -100, output.predictions, tokenizer.pad_token_id)
            texts = tokenizer.batch_decode(predictions, skip_special_tokens=True)
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w") as file:
                file.write("\n".join(text.strip() for text in texts) + "\n")

    publish(
        trainer,
        task="summarization",
        dataset=dataset_name(data_args, BUNDLED_DATA),
        metrics=eval_metrics,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    main()
