"""Fine-tune (or train from scratch) a Fastformer text classifier, as transformers' run_classification.py.

With no data arguments it trains on the bundled 20 Newsgroups subset (data/20newsgroups). Reports accuracy and
macro-F1 (the paper's metrics; mean squared error for a regression: --do_regression, or float labels), writes
eval_results.json / all_results.json, and saves a Hub-ready folder (weights, config, code for trust_remote_code,
tokenizer, model card). Any transformers model type trains too (--model_type bert) for comparisons.
Multi-process: see docs/SCALING.md (accelerate launch / torchrun).

    python scripts/run_classification.py --output_dir runs/newsgroups --do_train --do_eval
"""

import json
import logging
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import datasets
import evaluate
import numpy as np
from sklearn.metrics import accuracy_score, f1_score, mean_squared_error
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    set_seed,
)

from fastformer.cli import fail, parse_args
from training_utils import (
    DataArguments,
    ModelArguments,
    ModelCardTrainerMixin,
    SplitOrderTrainerMixin,
    dataset_name,
    load_config,
    load_model,
    load_raw_datasets,
    load_tokenizer,
    padding,
    publish,
    require_columns,
    setup_logging,
    tokenize_splits,
    train_and_evaluate,
)

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parents[1]  # the source checkout this script is part of
BUNDLED_TOKENIZER = REPO / "data" / "tokenizers" / "bert-base-uncased"
NEWSGROUPS = REPO / "data" / "20newsgroups"
BUNDLED = {"train": NEWSGROUPS / "train.jsonl", "validation": NEWSGROUPS / "test.jsonl"}


@dataclass
class DataTrainingArguments(DataArguments):
    pad_to_max_length: bool = field(
        default=True,
        metadata={"help": "Pad every text to --max_seq_length (--no_pad_to_max_length: each batch to its longest)."},
    )
    text_column_names: str = field(
        default="text", metadata={"help": "Comma-separated text columns, joined by --text_column_delimiter."}
    )
    text_column_delimiter: str | None = field(
        default=None, metadata={"help": "What joins several text columns (default: the separator token)."}
    )
    label_column_name: str = field(default="label", metadata={"help": "The label column (strings or integers)."})
    # `bool`, not `bool | None`: HfArgumentParser then reads a bare --do_regression as true
    do_regression: bool = field(
        default=None, metadata={"help": "Regress a number (MSE loss) rather than classify (default: float labels)."}
    )
    max_seq_length: int = field(default=512, metadata={"help": "Longer texts are truncated."})
    train_split_name: str | None = field(default=None, metadata={"help": "The split to train on (default: train)."})
    validation_split_name: str | None = field(
        default=None, metadata={"help": "The split to evaluate on (default: validation)."}
    )
    test_split_name: str | None = field(default=None, metadata={"help": "The split to predict (default: test)."})
    remove_splits: str | None = field(default=None, metadata={"help": "Comma-separated splits to drop."})
    remove_columns: str | None = field(default=None, metadata={"help": "Comma-separated columns to drop."})
    shuffle_train_dataset: bool = field(
        default=False, metadata={"help": "Shuffle the training data (before --max_train_samples)."}
    )
    shuffle_seed: int = field(default=42, metadata={"help": "The seed of --shuffle_train_dataset."})
    metric_name: str | None = field(
        default=None,
        metadata={"help": "An `evaluate` metric (Hub name or local script) to report besides the default metrics."},
    )


ARGUMENTS = (ModelArguments, DataTrainingArguments, TrainingArguments)


def names(flag_value: str | None) -> list[str]:
    return [] if flag_value is None else [name.strip() for name in flag_value.split(",")]


def arrange_splits(raw, data_args):
    """--remove_splits, then --train/validation/test_split_name (renamed train, validation, test), then
    --remove_columns and --shuffle_train_dataset, in the order of transformers' run_classification.py."""
    raw = datasets.DatasetDict(raw)  # the caller's stays as it was
    for split in names(data_args.remove_splits):
        if split not in raw:
            fail(f"--remove_splits: no split {split!r} in the data, which has {list(raw)}")
        raw.pop(split)
    chosen = {
        "train": data_args.train_split_name,
        "validation": data_args.validation_split_name,
        "test": data_args.test_split_name,
    }
    for split, name in chosen.items():
        if name is None:
            continue
        if name not in raw:
            fail(f"--{split}_split_name: no split {name!r} in the data, which has {list(raw)}")
        raw[split] = raw.pop(name)
    removed = names(data_args.remove_columns)
    for split in raw:
        require_columns(raw[split], removed, "--remove_columns")
    raw = raw.remove_columns(removed)
    if data_args.shuffle_train_dataset and "train" in raw:
        raw["train"] = raw["train"].shuffle(seed=data_args.shuffle_seed)
    return raw


class ClassificationTrainer(ModelCardTrainerMixin, SplitOrderTrainerMixin, Trainer):
    pass


def predicted(logits, is_regression: bool) -> np.ndarray:
    """The predicted numbers (regression) or class ids."""
    return np.squeeze(logits, axis=-1) if is_regression else np.argmax(logits, axis=-1)


def compute_metrics(prediction, *, is_regression: bool, metric=None) -> dict:
    """Accuracy and macro-F1 (the paper's), or the mean squared error of a regression; and the --metric_name
    metric's results."""
    values, labels = predicted(prediction.predictions, is_regression), prediction.label_ids
    if is_regression:
        result = {"mse": float(mean_squared_error(labels, values))}
    else:
        result = {
            "accuracy": float(accuracy_score(labels, values)),
            "f1_macro": float(f1_score(labels, values, average="macro")),
        }
    if metric is not None:
        result.update(metric.compute(predictions=values, references=labels))
    return result


def main():
    model_args, data_args, training_args = parse_args(ARGUMENTS)
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = arrange_splits(load_raw_datasets(data_args, model_args, BUNDLED), data_args)
    text_columns = names(data_args.text_column_names)
    label_column = data_args.label_column_name
    for split in raw:
        require_columns(raw[split], text_columns, "--text_column_names")
    labelled = [split for split in raw if split != "test" or label_column in raw[split].column_names]
    for split in labelled:
        require_columns(raw[split], [label_column], "--label_column_name")
    is_regression = data_args.do_regression
    if is_regression is None:  # as the transformers example: float labels are a regression
        is_regression = any(raw[split].features[label_column].dtype in ("float32", "float64") for split in labelled)
    if is_regression:
        labels = label2id = None
        task_settings = {"num_labels": 1, "problem_type": "regression"}
    else:
        labels = sorted({label for split in labelled for label in raw[split][label_column]}, key=str)
        label2id = {label: index for index, label in enumerate(labels)}
        task_settings = {
            "num_labels": len(labels),
            "id2label": {index: str(label) for label, index in label2id.items()},
            "label2id": {str(label): index for label, index in label2id.items()},
        }

    tokenizer = load_tokenizer(model_args, BUNDLED_TOKENIZER)
    config = load_config(model_args, tokenizer, data_args.max_seq_length, **task_settings)
    model = load_model(AutoModelForSequenceClassification, model_args, config)
    delimiter = data_args.text_column_delimiter
    if delimiter is None:
        delimiter = f" {tokenizer.sep_token} "

    def preprocess(batch):
        joined = [delimiter.join(parts) for parts in zip(*(batch[column] for column in text_columns))]
        encoded = tokenizer(joined, truncation=True, max_length=data_args.max_seq_length, padding=padding(data_args))
        if label_column in batch:
            targets = batch[label_column]
            encoded["labels"] = [float(x) for x in targets] if is_regression else [label2id[x] for x in targets]
        return encoded

    prepared = tokenize_splits(raw, data_args, training_args, preprocess)
    metric = evaluate.load(data_args.metric_name, cache_dir=model_args.cache_dir) if data_args.metric_name else None

    trainer = ClassificationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None),
        compute_metrics=partial(compute_metrics, is_regression=is_regression, metric=metric),
    )

    eval_metrics = train_and_evaluate(trainer, prepared)

    if training_args.do_predict:
        output = trainer.predict(prepared["test"], metric_key_prefix="test")
        if output.label_ids is not None:
            trainer.log_metrics("test", output.metrics)
            trainer.save_metrics("test", output.metrics)
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predictions.jsonl"), "w") as file:
                for index, value in enumerate(predicted(output.predictions, is_regression)):
                    prediction = float(value) if is_regression else str(labels[value])
                    file.write(json.dumps({"index": index, "prediction": prediction}) + "\n")

    publish(
        trainer,
        task="text-classification",
        dataset=dataset_name(data_args, NEWSGROUPS),
        metrics=eval_metrics,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    main()
