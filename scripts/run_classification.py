"""Fine-tune (or train from scratch) a Fastformer text classifier, as transformers' run_classification.py.

With no data arguments it trains on the bundled 20 Newsgroups subset (data/20newsgroups). Reports accuracy and
macro-F1 (the paper's metrics), writes eval_results.json / all_results.json, and saves a Hub-ready folder
(weights, config, code for trust_remote_code, tokenizer, model card). Any transformers model type trains too
(--model_type bert) for comparisons. Multi-process: see docs/SCALING.md (accelerate launch / torchrun).

    python scripts/run_classification.py --output_dir runs/newsgroups --do_train --do_eval
"""

import json
import logging
import os
from dataclasses import dataclass, field

import numpy as np
from sklearn.metrics import accuracy_score, f1_score
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from common import (
    REPO,
    ModelArguments,
    ModelCardTrainerMixin,
    dataset_name,
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
NEWSGROUPS = REPO / "data" / "20newsgroups"
BUNDLED = {"train": NEWSGROUPS / "train.jsonl", "validation": NEWSGROUPS / "test.jsonl"}


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "A data set on the Hub."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: json, jsonl or csv."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data: json, jsonl or csv."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data: json, jsonl or csv."})
    text_column_names: str = field(
        default="text", metadata={"help": "Comma-separated text columns; several are joined with the separator token."}
    )
    label_column_name: str = field(default="label", metadata={"help": "The label column (strings or integers)."})
    max_seq_length: int = field(default=512, metadata={"help": "Longer texts are truncated."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N prediction examples."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


class ClassificationTrainer(ModelCardTrainerMixin, Trainer):
    pass


def compute_metrics(prediction):
    predicted = np.argmax(prediction.predictions, axis=-1)
    return {
        "accuracy": float(accuracy_score(prediction.label_ids, predicted)),
        "f1_macro": float(f1_score(prediction.label_ids, predicted, average="macro")),
    }


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED)
    text_columns = [name.strip() for name in data_args.text_column_names.split(",")]
    for split in raw:
        require_columns(raw[split], text_columns, "--text_column_names")
    labelled = [split for split in raw if split != "test" or data_args.label_column_name in raw[split].column_names]
    for split in labelled:
        require_columns(raw[split], [data_args.label_column_name], "--label_column_name")
    labels = sorted({label for split in labelled for label in raw[split][data_args.label_column_name]}, key=str)
    label2id = {label: index for index, label in enumerate(labels)}

    tokenizer = load_tokenizer(model_args)
    config = load_config(
        model_args,
        tokenizer,
        data_args.max_seq_length,
        num_labels=len(labels),
        id2label={index: str(label) for label, index in label2id.items()},
        label2id={str(label): index for label, index in label2id.items()},
    )
    model = load_model(AutoModelForSequenceClassification, model_args, config)

    def preprocess(batch):
        texts = [batch[column] for column in text_columns]
        joined = [f" {tokenizer.sep_token} ".join(parts) for parts in zip(*texts)] if len(texts) > 1 else texts[0]
        encoded = tokenizer(joined, truncation=True, max_length=data_args.max_seq_length)
        if data_args.label_column_name in batch:
            encoded["labels"] = [label2id[label] for label in batch[data_args.label_column_name]]
        return encoded

    prepared = tokenize_splits(raw, data_args, training_args, preprocess)

    trainer = ClassificationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None),
        compute_metrics=compute_metrics,
    )

    eval_metrics = train_and_evaluate(trainer, prepared)

    if training_args.do_predict:
        output = trainer.predict(prepared["test"], metric_key_prefix="test")
        if output.metrics and "test_accuracy" in output.metrics:
            trainer.log_metrics("test", output.metrics)
            trainer.save_metrics("test", output.metrics)
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predictions.jsonl"), "w") as file:
                for index, predicted in enumerate(np.argmax(output.predictions, axis=-1)):
                    file.write(json.dumps({"index": index, "prediction": str(labels[predicted])}) + "\n")

    publish(trainer, task="text-classification", dataset=dataset_name(data_args, NEWSGROUPS),
            metrics=eval_metrics, base_model=model_args.model_name_or_path)


if __name__ == "__main__":
    main()
