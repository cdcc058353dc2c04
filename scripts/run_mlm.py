"""Pretrain a Fastformer encoder with masked language modeling on raw text, as transformers' run_mlm.py.

Text files (.txt: one text per line; or json/jsonl/csv with --text_column_name) or a Hub data set, read as it is
used with --streaming. Texts are tokenized and packed into blocks of --max_seq_length tokens (--line_by_line: one
example per text); 15% of tokens are masked (--mlm_probability). Without validation data the first 5% of the
training data is held out (--validation_split_percentage). Reports the evaluation loss and perplexity, writes
eval_results.json / all_results.json, and saves a Hub-ready folder that run_classification.py fine-tunes with
--model_name_or_path. With no data arguments it pretrains on the texts of the bundled 20 Newsgroups subset.

    python scripts/run_mlm.py --output_dir runs/mlm --do_train --do_eval
    python scripts/run_classification.py --model_name_or_path runs/mlm --output_dir runs/cls --do_train --do_eval
"""

import logging
import math
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path

import datasets
from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    Trainer,
    TrainingArguments,
    set_seed,
)

from fastformer.cli import fail, parse_args
from training_utils import (
    DATA_EXTENSIONS,
    DataArguments,
    ModelArguments,
    ModelCardTrainerMixin,
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
TEXT_EXTENSIONS = {**DATA_EXTENSIONS, ".txt": "text"}  # .txt: one example per line, in a column named "text"
REPO = Path(__file__).resolve().parents[1]  # the source checkout this script is part of
BUNDLED_TOKENIZER = REPO / "data" / "tokenizers" / "bert-base-uncased"
NEWSGROUPS = REPO / "data" / "20newsgroups"
BUNDLED = {"train": NEWSGROUPS / "train.jsonl", "validation": NEWSGROUPS / "test.jsonl"}


@dataclass
class DataTrainingArguments(DataArguments):
    text_column_name: str = field(default="text", metadata={"help": "The text column."})
    max_seq_length: int = field(default=512, metadata={"help": "Tokens per packed block (per text: --line_by_line)."})
    mlm_probability: float = field(default=0.15, metadata={"help": "Share of tokens to mask."})
    line_by_line: bool = field(
        default=False,
        metadata={"help": "Each text (each line of a .txt) one example, cut to --max_seq_length, rather than packed."},
    )
    validation_split_percentage: int | None = field(
        default=5, metadata={"help": "With no validation data: this percentage of the training data, taken first."}
    )
    streaming: bool = field(
        default=False, metadata={"help": "Read the data as it is used (for corpora too big to prepare; --max_steps)."}
    )


ARGUMENTS = (ModelArguments, DataTrainingArguments, TrainingArguments)


def split_off_validation(raw, percentage: int):
    """The first `percentage`% of the training data as validation data, the rest as training data (as
    transformers' run_mlm.py with split="train[:5%]" and "train[5%:]")."""
    train = raw["train"]
    if isinstance(train, datasets.IterableDataset):
        fail("--streaming needs validation data: --validation_split_percentage cannot cut a stream")
    cut = round(len(train) * percentage / 100)
    raw["validation"], raw["train"] = train.select(range(cut)), train.select(range(cut, len(train)))
    return raw


class MaskedLMTrainer(ModelCardTrainerMixin, Trainer):
    pass


def main():
    model_args, data_args, training_args = parse_args(ARGUMENTS)
    setup_logging(training_args)
    set_seed(training_args.seed)

    raw = load_raw_datasets(data_args, model_args, BUNDLED, TEXT_EXTENSIONS, streaming=data_args.streaming)
    if "validation" not in raw and "train" in raw and data_args.validation_split_percentage:
        raw = split_off_validation(raw, data_args.validation_split_percentage)
    for split in raw:
        require_columns(raw[split], [data_args.text_column_name], "--text_column_name")
    tokenizer = load_tokenizer(model_args, BUNDLED_TOKENIZER)
    config = load_config(model_args, tokenizer, data_args.max_seq_length)
    model = load_model(AutoModelForMaskedLM, model_args, config)
    block = data_args.max_seq_length

    def texts(batch):
        return [text for text in batch[data_args.text_column_name] if text and not text.isspace()]

    def tokenize_lines(batch):
        """Each text one example, cut to max_seq_length (padded to it with --pad_to_max_length)."""
        return tokenizer(
            texts(batch), truncation=True, max_length=block, padding=padding(data_args), return_special_tokens_mask=True
        )

    def tokenize_packed(batch):
        """Tokenize the texts, concatenate them and cut them into blocks of max_seq_length (the rest is dropped)."""
        tokens = tokenizer(texts(batch), return_special_tokens_mask=True)
        joined = {key: list(chain(*values)) for key, values in tokens.items()}
        length = len(joined["input_ids"]) // block * block
        return {key: [values[i : i + block] for i in range(0, length, block)] for key, values in joined.items()}

    # --max_*_samples count blocks (or texts), as in transformers' run_mlm.py
    preprocess = tokenize_lines if data_args.line_by_line else tokenize_packed
    prepared = tokenize_splits(raw, data_args, training_args, preprocess, cut_after=True)
    for split, examples in prepared.items():
        if isinstance(examples, datasets.Dataset) and len(examples) == 0:
            fail(f"the {split} text has fewer than --max_seq_length={block} tokens")

    trainer = MaskedLMTrainer(
        model=model,
        args=training_args,
        train_dataset=prepared.get("train"),
        eval_dataset=prepared.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm_probability=data_args.mlm_probability),
    )

    def perplexity(metrics):
        return {"perplexity": math.exp(metrics["eval_loss"]) if metrics["eval_loss"] < 700 else math.inf}

    eval_metrics = train_and_evaluate(trainer, prepared, add_eval_metrics=perplexity)
    publish(
        trainer,
        task="fill-mask",
        dataset=dataset_name(data_args, NEWSGROUPS),
        metrics=eval_metrics,
        base_model=model_args.model_name_or_path,
    )


if __name__ == "__main__":
    main()
