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
from dataclasses import dataclass, field
from itertools import chain

from transformers import (
    AutoModelForMaskedLM,
    DataCollatorForLanguageModeling,
    HfArgumentParser,
    Trainer,
    TrainingArguments,
    set_seed,
)

from common import (
    DATA_EXTENSIONS,
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
TEXT_EXTENSIONS = {**DATA_EXTENSIONS, ".txt": "text"}  # .txt: one example per line, in a column named "text"
NEWSGROUPS = REPO / "data" / "20newsgroups"
BUNDLED = {"train": NEWSGROUPS / "train.jsonl", "validation": NEWSGROUPS / "test.jsonl"}


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
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training texts."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N evaluation texts."})
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

    def preprocess(batch):
        """Tokenize the texts, concatenate them and cut them into blocks of max_seq_length (the rest is dropped)."""
        texts = [text for text in batch[data_args.text_column_name] if text and not text.isspace()]
        tokens = tokenizer(texts, return_special_tokens_mask=True)
        joined = {key: list(chain(*values)) for key, values in tokens.items()}
        length = len(joined["input_ids"]) // block * block
        return {key: [values[i : i + block] for i in range(0, length, block)] for key, values in joined.items()}

    prepared = tokenize_splits(raw, data_args, training_args, preprocess)
    for split, blocks in prepared.items():
        if len(blocks) == 0:
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
    publish(trainer, task="fill-mask", dataset=dataset_name(data_args, NEWSGROUPS),
            metrics=eval_metrics, base_model=model_args.model_name_or_path)


if __name__ == "__main__":
    main()
