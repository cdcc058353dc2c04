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
from common import (
    REPO,
    ModelArguments,
    ModelCardTrainerMixin,
    fail,
    load_config,
    load_model,
    load_raw_datasets,
    load_tokenizer,
    require_columns,
    save_hub_ready,
    setup_logging,
)
from sklearn.metrics import accuracy_score, f1_score
from transformers import (
    AutoModelForSequenceClassification,
    DataCollatorWithPadding,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

logger = logging.getLogger(__name__)
BUNDLED = {"train": REPO / "data" / "20newsgroups" / "train.jsonl", "validation": REPO / "data" / "20newsgroups" / "test.jsonl"}


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

    def prepare(split, limit):
        dataset = raw[split] if limit is None else raw[split].select(range(min(limit, len(raw[split]))))
        with training_args.main_process_first(desc=f"{split} tokenization"):
            return dataset.map(
                preprocess,
                batched=True,
                remove_columns=raw[split].column_names,
                num_proc=data_args.preprocessing_num_workers,
                desc=f"Tokenizing {split}",
            )

    splits = {"train": training_args.do_train, "validation": training_args.do_eval, "test": training_args.do_predict}
    for split, wanted in splits.items():
        if wanted and split not in raw:
            fail(f"--do_{ {'validation': 'eval', 'test': 'predict'}.get(split, split)} needs {split} data")
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
              "test": data_args.max_predict_samples}
    prepared = {split: prepare(split, limits[split]) for split, wanted in splits.items() if wanted}

    trainer = ClassificationTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if training_args.fp16 else None),
        compute_metrics=compute_metrics,
    )

    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics = {**result.metrics, "train_samples": len(prepared["train"])}
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    eval_metrics = {}
    if training_args.do_eval:
        eval_metrics = {**trainer.evaluate(), "eval_samples": len(prepared["validation"])}
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)

    if training_args.do_predict:
        output = trainer.predict(prepared["test"], metric_key_prefix="test")
        if output.metrics and "test_accuracy" in output.metrics:
            trainer.log_metrics("test", output.metrics)
            trainer.save_metrics("test", output.metrics)
        if trainer.is_world_process_zero():
            with open(os.path.join(training_args.output_dir, "predictions.jsonl"), "w") as file:
                for index, predicted in enumerate(np.argmax(output.predictions, axis=-1)):
                    file.write(json.dumps({"index": index, "prediction": str(labels[predicted])}) + "\n")

    trainer.card_settings = dict(
        task="text-classification",
        dataset=data_args.dataset_name or str((data_args.train_file and os.path.dirname(data_args.train_file))
                                                or BUNDLED["train"].parent.relative_to(REPO)),
        metrics=eval_metrics,
        base_model=model_args.model_name_or_path,
    )
    if training_args.do_train:
        save_hub_ready(trainer, **trainer.card_settings)
    if training_args.push_to_hub:
        trainer.push_to_hub()


if __name__ == "__main__":
    main()
