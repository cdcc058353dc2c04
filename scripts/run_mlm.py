"""Pretrain a Fastformer encoder with masked language modeling on raw text, as transformers' run_mlm.py.

Text files (.txt: one text per line; or json/jsonl/csv with --text_column_name) or a Hub data set. Texts are
tokenized and packed into blocks of --max_seq_length tokens; 15% of tokens are masked (--mlm_probability).
Reports the evaluation loss and perplexity, writes eval_results.json / all_results.json, and saves a Hub-ready
folder that run_classification.py fine-tunes with --model_name_or_path. With no data arguments it pretrains on
the texts of the bundled 20 Newsgroups subset.

    python scripts/run_mlm.py --output_dir runs/mlm --do_train --do_eval
    python scripts/run_classification.py --model_name_or_path runs/mlm --output_dir runs/cls --do_train --do_eval
"""

import logging
import math
import os
from dataclasses import dataclass, field
from itertools import chain

from common import (
    DATA_EXTENSIONS,
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
from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

logger = logging.getLogger(__name__)
TEXT_EXTENSIONS = {**DATA_EXTENSIONS, ".txt": "text"}  # .txt: one example per line, in a column named "text"
BUNDLED = {"train": REPO / "data" / "20newsgroups" / "train.jsonl", "validation": REPO / "data" / "20newsgroups" / "test.jsonl"}


@dataclass
class DataTrainingArguments:
    dataset_name: str | None = field(default=None, metadata={"help": "A data set on the Hub."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training text: txt, json, jsonl or csv."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation text: txt, json, jsonl or csv."})
    test_file: str | None = field(default=None, metadata={"help": "Not used by this script."})
    text_column_name: str = field(default="text", metadata={"help": "The text column."})
    max_seq_length: int = field(default=512, metadata={"help": "Tokens per packed block."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens to mask."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N blocks for training."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N blocks for evaluation."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


class MaskedLMTrainer(ModelCardTrainerMixin, Trainer):
    pass


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED, TEXT_EXTENSIONS)
    for split in raw:
        require_columns(raw[split], [data_args.text_column_name], "--text_column_name")
    tokenizer = load_tokenizer(model_args)
    config = load_config(model_args, tokenizer, data_args.max_seq_length)
    model = load_model(AutoModelForMaskedLM, model_args, config)
    block = data_args.max_seq_length

    def tokenize(batch):
        return tokenizer([text for text in batch[data_args.text_column_name] if text and not text.isspace()],
                         return_special_tokens_mask=True)

    def pack(batch):
        """Concatenate the tokenized texts and cut them into blocks of max_seq_length (the remainder is dropped)."""
        joined = {key: list(chain(*batch[key])) for key in batch}
        length = len(joined["input_ids"]) // block * block
        return {key: [values[i : i + block] for i in range(0, length, block)] for key, values in joined.items()}

    splits = {"train": training_args.do_train, "validation": training_args.do_eval}
    limits = {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples}
    prepared = {}
    for split, wanted in splits.items():
        if not wanted:
            continue
        with training_args.main_process_first(desc=f"{split} tokenization"):
            tokens = raw[split].map(tokenize, batched=True, remove_columns=raw[split].column_names,
                                    num_proc=data_args.preprocessing_num_workers, desc=f"Tokenizing {split}")
            blocks = tokens.map(pack, batched=True, num_proc=data_args.preprocessing_num_workers,
                                desc=f"Packing {split} into blocks of {block}")
        if limits[split] is not None:
            blocks = blocks.select(range(min(limits[split], len(blocks))))
        if len(blocks) == 0:
            fail(f"the {split} text has fewer than --max_seq_length={block} tokens")
        prepared[split] = blocks

    trainer = MaskedLMTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability),
    )

    if training_args.do_train:
        result = trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
        metrics = {**result.metrics, "train_samples": len(prepared["train"])}
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    eval_metrics = {}
    if training_args.do_eval:
        eval_metrics = trainer.evaluate()
        eval_metrics["eval_samples"] = len(prepared["validation"])
        eval_metrics["perplexity"] = math.exp(eval_metrics["eval_loss"]) if eval_metrics["eval_loss"] < 700 else math.inf
        trainer.log_metrics("eval", eval_metrics)
        trainer.save_metrics("eval", eval_metrics)

    trainer.card_settings = dict(
        task="fill-mask",
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
