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

import numpy as np
from rouge_score import rouge_scorer, scoring
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)

from common import (
    REPO,
    ModelArguments,
    ModelCardTrainerMixin,
    dataset_name,
    fail,
    load_config,
    load_model,
    load_raw_datasets,
    load_tokenizer,
    publish,
    require_columns,
    setup_logging,
    tokenize_splits,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)
BUNDLED_DATA = REPO / "data" / "news_headlines"
BUNDLED = {split: BUNDLED_DATA / f"{split}.jsonl" for split in ("train", "validation", "test")}
ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "A data set on the Hub."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: json, jsonl or csv."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data: json, jsonl or csv."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data: json, jsonl or csv."})
    text_column: str | None = field(default=None, metadata={"help": "Input column (default: document)."})
    summary_column: str | None = field(default=None, metadata={"help": "Target column (default: summary)."})
    max_source_length: int = field(default=512, metadata={"help": "Longer inputs are truncated."})
    max_target_length: int = field(default=64, metadata={"help": "Longer targets are truncated."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N prediction examples."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


class SummarizationTrainer(ModelCardTrainerMixin, Seq2SeqTrainer):
    pass


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE F-measures x 100, aggregated as the `evaluate` rouge metric does, without the Hub."""
    scorer = rouge_scorer.RougeScorer(ROUGE_TYPES, use_stemmer=True)
    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references):
        aggregator.add_scores(scorer.score(reference, prediction))
    return {name: 100 * score.mid.fmeasure for name, score in aggregator.aggregate().items()}


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, Seq2SeqTrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED)
    columns = next(iter(raw.values())).column_names
    text_column = data_args.text_column or ("document" if "document" in columns else columns[0])
    summary_column = data_args.summary_column or ("summary" if "summary" in columns else columns[1 % len(columns)])
    for split in raw:
        require_columns(raw[split], [text_column], "--text_column")
        require_columns(raw[split], [summary_column], "--summary_column")

    tokenizer = load_tokenizer(model_args)
    config = load_config(model_args, tokenizer, max(data_args.max_source_length, data_args.max_target_length))
    model = load_model(AutoModelForSeq2SeqLM, model_args, config)
    for name in ("decoder_start_token_id", "eos_token_id"):
        if getattr(model.config, name, None) is None:
            fail(f"the model config has no {name}: set it with --config_overrides {name}=ID")
    eos = model.config.eos_token_id

    def preprocess(batch):
        encoded = tokenizer(batch[text_column], max_length=data_args.max_source_length, truncation=True)
        # the target ids then end-of-sequence: the decoder starts from decoder_start_token_id by itself
        targets = tokenizer(text_target=batch[summary_column], add_special_tokens=False)["input_ids"]
        encoded["labels"] = [ids[: data_args.max_target_length - 1] + [eos] for ids in targets]
        return encoded

    prepared = tokenize_splits(raw, data_args, training_args, preprocess)

    def compute_metrics(prediction):
        predictions = np.where(prediction.predictions != -100, prediction.predictions, tokenizer.pad_token_id)
        labels = np.where(prediction.label_ids != -100, prediction.label_ids, tokenizer.pad_token_id)
        decoded = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        lengths = [np.count_nonzero(row != tokenizer.pad_token_id) for row in predictions]
        return {**rouge(decoded, references), "gen_len": float(np.mean(lengths))}

    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.max_target_length
    trainer = SummarizationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        compute_metrics=compute_metrics if training_args.predict_with_generate else None,
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

    publish(trainer, task="summarization", dataset=dataset_name(data_args, BUNDLED_DATA),
            metrics=eval_metrics, base_model=model_args.model_name_or_path)


if __name__ == "__main__":
    main()
