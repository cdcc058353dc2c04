"""What the training scripts beside this module share: model and data arguments, building a config, tokenizer and
model from scratch or from a checkpoint, loading local files or Hub data sets, training and evaluating, and saving a
Hub-ready folder with a model card.

The scripts follow the transformers examples (HfArgumentParser over dataclasses and TrainingArguments), so the
flags are the ones users know. The bundled data and tokenizer are a source checkout's: the scripts pass their paths
as defaults, used where they exist.
"""

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import datasets
import torch
from huggingface_hub.errors import StrictDataclassError
from torch.utils.data import SequentialSampler
from transformers import CONFIG_MAPPING, AutoConfig, AutoTokenizer
from transformers.trainer_utils import get_last_checkpoint, has_length

from fastformer import cli
from fastformer.cli import check_weights_readable, fail
from fastformer.model_card import hyperparameters, write_model_card

DATA_EXTENSIONS = {".json": "json", ".jsonl": "json", ".csv": "csv"}

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Checkpoint to fine-tune (local folder or Hub id). Leave out to train from scratch."},
    )
    model_type: str = field(
        default="fastformer",
        metadata={
            "help": "Architecture to train from scratch: fastformer, or a transformers model type (bert, bart). With "
            "a checkpoint, a model type that extends its config: fastformer_copy loads a Fastformer seq2seq "
            "checkpoint with the copy head (FastformerCopyForConditionalGeneration), new weights for the head."
        },
    )
    config_name: str | None = field(default=None, metadata={"help": "Config to start from, if not the model's."})
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Config fields to override, e.g. 'num_hidden_layers=4,interaction=add,share_layers=false'."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer, if not the model's; from scratch: the bundled bert-base-uncased."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to cache Hub downloads."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the checkpoint."})
    token: str | None = field(default=None, metadata={"help": "Hub token (default: the cached login)."})
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Run a checkpoint's own code (e.g. Fastformer without this package)."}
    )
    ignore_mismatched_sizes: bool = field(
        default=False, metadata={"help": "Start afresh the checkpoint's weights of another shape (e.g. a new head)."}
    )
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "The weights' dtype (default, 'auto': a checkpoint's own dtype, float32 for a new model).",
            "choices": ["auto", "bfloat16", "float16", "float32"],
        },
    )


@dataclass
class DataArguments:
    """The data flags all three scripts have; each script's DataTrainingArguments adds its own."""

    dataset_name: str | None = field(default=None, metadata={"help": "A data set on the Hub."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration."})
    train_file: str | None = field(default=None, metadata={"help": "Training data: json, jsonl, csv (or txt: MLM)."})
    validation_file: str | None = field(default=None, metadata={"help": "Evaluation data, as --train_file."})
    test_file: str | None = field(default=None, metadata={"help": "Prediction data (--do_predict), as --train_file."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training examples."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N evaluation examples."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N prediction examples."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})
    overwrite_cache: bool = field(default=False, metadata={"help": "Tokenize again rather than reuse the cache."})
    pad_to_max_length: bool = field(
        default=False,
        metadata={"help": "Pad every example to the maximum length, not each batch to its longest example."},
    )


def setup_logging(training_args):
    """`fastformer.cli.setup_logging`, this module's log included."""
    cli.setup_logging(training_args, logger)


def hub_kwargs(model_args) -> dict:
    return dict(
        cache_dir=model_args.cache_dir,
        revision=model_args.model_revision,
        token=model_args.token,
        trust_remote_code=model_args.trust_remote_code,
    )


def load_tokenizer(model_args, bundled: Path | None = None):
    """--tokenizer_name, else --model_name_or_path's, else `bundled` (the tokenizer a source checkout ships)."""
    flag = "--tokenizer_name" if model_args.tokenizer_name else "--model_name_or_path"
    source = model_args.tokenizer_name or model_args.model_name_or_path or bundled
    if source is None or (source == bundled and not bundled.is_dir()):
        fail("pass --tokenizer_name (or --model_name_or_path): the bundled tokenizer comes with a source checkout only")
    try:
        return AutoTokenizer.from_pretrained(source, **hub_kwargs(model_args))
    except (OSError, ValueError) as error:  # a folder not written yet is looked up on the Hub: say so by name
        if Path(source).is_dir():
            raise
        fail(f"{flag} {source}: no such folder, and the Hub did not serve it ({str(error).splitlines()[0]})")


def padding(data_args) -> str | bool:
    """The tokenizer's `padding` for --pad_to_max_length; otherwise the data collator pads each batch."""
    return "max_length" if data_args.pad_to_max_length else False


def load_config(model_args, tokenizer, max_length: int, **task_settings):
    """The checkpoint's config, or a new one of `model_type` sized to the tokenizer; then the overrides,
    validated by the config class itself."""
    source = model_args.config_name or model_args.model_name_or_path
    if source:
        config = AutoConfig.from_pretrained(source, **task_settings, **hub_kwargs(model_args))
        extended = CONFIG_MAPPING[model_args.model_type] if model_args.model_type in CONFIG_MAPPING else None
        if extended is not None and extended is not type(config) and issubclass(extended, type(config)):
            config = extended(**config.to_diff_dict())
    else:
        try:
            config = AutoConfig.for_model(model_args.model_type, **task_settings)
        except ValueError:
            fail(f"unknown --model_type {model_args.model_type!r}: use fastformer or a transformers model type")
        # a new model: its vocabulary, special tokens and positions follow the tokenizer and the data
        config.vocab_size = len(tokenizer)
        special = {"pad_token_id": tokenizer.pad_token_id}
        bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id  # BERT-style tokenizers have [CLS] and [SEP]
        special["bos_token_id"] = bos if bos is not None else tokenizer.cls_token_id
        special["eos_token_id"] = eos if eos is not None else tokenizer.sep_token_id
        if config.is_encoder_decoder or model_args.model_type == "fastformer":
            special["decoder_start_token_id"] = special["bos_token_id"]
        for name, value in special.items():
            setattr(config, name, value)
        if getattr(config, "max_position_embeddings", max_length) < max_length:
            config.max_position_embeddings = max_length
    if model_args.config_overrides:
        logger.info(f"Overriding config: {model_args.config_overrides}")
        try:
            config.update_from_string(model_args.config_overrides)
            config = config.__class__.from_dict(config.to_dict())  # the class's own validation
        except (ValueError, StrictDataclassError) as error:  # @strict's errors, as transformers' configs raise them
            fail(f"--config_overrides: {error}")
    return config


def load_model(auto_class, model_args, config):
    # transformers' default, as --dtype auto: a checkpoint's own dtype, float32 for a new model
    dtype = {} if model_args.dtype in (None, "auto") else {"dtype": getattr(torch, model_args.dtype)}
    if model_args.model_name_or_path:
        check_weights_readable(model_args.model_name_or_path)
        return auto_class.from_pretrained(
            model_args.model_name_or_path,
            config=config,
            ignore_mismatched_sizes=model_args.ignore_mismatched_sizes,
            **dtype,
            **hub_kwargs(model_args),
        )
    logger.info(f"Training a new {config.model_type} model from scratch")
    return auto_class.from_config(config, trust_remote_code=model_args.trust_remote_code, **dtype)


def load_raw_datasets(
    data_args,
    model_args,
    default_files: dict[str, Path],
    extensions: dict[str, str] = DATA_EXTENSIONS,
    streaming: bool = False,
) -> datasets.DatasetDict | datasets.IterableDatasetDict:
    """A Hub data set (--dataset_name), local files (--train_file, ...) of the given `extensions` (file suffix ->
    datasets loader), or the bundled data. With `streaming` the rows are read as they are used."""
    if data_args.dataset_name:
        return datasets.load_dataset(
            data_args.dataset_name,
            data_args.dataset_config_name,
            cache_dir=model_args.cache_dir,
            token=model_args.token,
            streaming=streaming,
        )
    files = {
        split: path
        for split, path in [
            ("train", data_args.train_file),
            ("validation", data_args.validation_file),
            ("test", data_args.test_file),
        ]
        if path
    }
    if not files:
        if not all(path.is_file() for path in default_files.values()):
            fail(
                "pass --train_file and --validation_file (or --dataset_name): the bundled data comes with a source "
                "checkout only"
            )
        logger.info(f"No data given: using the bundled {default_files['train'].parent}")
        files = {split: str(path) for split, path in default_files.items()}
    kinds = set()
    for split, path in files.items():
        extension = Path(path).suffix
        if extension not in extensions:
            fail(f"--{split}_file {path}: unsupported extension {extension!r}, use one of {sorted(extensions)}")
        if not Path(path).is_file():
            fail(f"--{split}_file {path}: no such file")
        if Path(path).stat().st_size == 0:
            fail(f"--{split}_file {path} is empty")
        kinds.add(extensions[extension])
    if len(kinds) > 1:
        fail(f"all data files must be of one kind (json/jsonl or csv), got {sorted(files.values())}")
    raw = datasets.load_dataset(kinds.pop(), data_files=files, cache_dir=model_args.cache_dir, streaming=streaming)
    if not streaming:  # a stream's rows are not counted before they are read
        for split, dataset in raw.items():
            if len(dataset) == 0:
                fail(f"the {split} data has no rows")
    return raw


def require_columns(dataset, columns, flag: str):
    missing = [column for column in columns if column not in dataset.column_names]
    if missing:
        fail(f"{flag}: column(s) {missing} not in the data, which has {dataset.column_names}")


SPLIT_FLAGS = {"train": "do_train", "validation": "do_eval", "test": "do_predict"}


def first(dataset, count: int | None):
    """The first `count` examples of `dataset` (all if None); a stream's are taken as it is read."""
    if count is None:
        return dataset
    if isinstance(dataset, datasets.IterableDataset):
        return dataset.take(count)
    return dataset.select(range(min(count, len(dataset))))


def tokenize_splits(
    raw, data_args, training_args, preprocess, cut_after: bool = False
) -> dict[str, datasets.Dataset | datasets.IterableDataset]:
    """The splits the run asks for (--do_train, --do_eval, --do_predict), mapped with `preprocess` (batched; it
    replaces the raw columns): one function, or one per split (split -> function). --max_*_samples cut the rows
    before, or with `cut_after` the examples that `preprocess` made (run_mlm.py's packed blocks)."""
    limits = {
        "train": data_args.max_train_samples,
        "validation": data_args.max_eval_samples,
        "test": data_args.max_predict_samples,
    }
    prepared = {}
    for split, flag in SPLIT_FLAGS.items():
        if not getattr(training_args, flag):
            continue
        if split not in raw:
            fail(f"--{flag} needs {split} data")
        dataset = raw[split] if cut_after else first(raw[split], limits[split])
        function = preprocess[split] if isinstance(preprocess, dict) else preprocess
        if isinstance(dataset, datasets.IterableDataset):
            mapped = dataset.map(function, batched=True, remove_columns=dataset.column_names)
        else:
            with training_args.main_process_first(desc=f"{split} preprocessing"):
                mapped = dataset.map(
                    function,
                    batched=True,
                    remove_columns=dataset.column_names,
                    num_proc=data_args.preprocessing_num_workers,
                    load_from_cache_file=not data_args.overwrite_cache,
                    desc=f"Preprocessing {split}",
                )
        prepared[split] = first(mapped, limits[split]) if cut_after else mapped
    return prepared


def samples(prefix: str, dataset) -> dict[str, int]:
    """{"<prefix>_samples": N} for the metrics files; a stream's length is not known."""
    return {} if isinstance(dataset, datasets.IterableDataset) else {f"{prefix}_samples": len(dataset)}


def train_and_evaluate(trainer, prepared, add_eval_metrics=None) -> dict:
    """--do_train and --do_eval as the transformers examples do them: metrics logged and written to
    train_results.json / eval_results.json / all_results.json. Returns the evaluation metrics."""
    if trainer.args.do_train and os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        # accelerate 1.15 shards on accelerators only, and says nothing
        if not trainer.is_fsdp_enabled and trainer.is_world_process_zero():
            logger.warning(
                "FSDP was asked for (ACCELERATE_USE_FSDP), but accelerate runs FSDP on accelerators only (GPU, NPU, "
                "XPU, HPU): on the CPU these processes train as DDP, each holding the whole model"
            )
    if trainer.args.do_train:
        resume = trainer.args.resume_from_checkpoint
        if resume and not Path(resume).is_dir() and Path(trainer.args.output_dir).is_dir():
            resume = get_last_checkpoint(trainer.args.output_dir)  # "True": the last one, as Trainer reads it
        if resume:
            check_weights_readable(resume)
        result = trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
        metrics = {**result.metrics, **samples("train", prepared["train"])}
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
    metrics = {}
    if trainer.args.do_eval:
        metrics = {**trainer.evaluate(), **samples("eval", prepared["validation"])}
        if add_eval_metrics is not None:
            metrics.update(add_eval_metrics(metrics))
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
    return metrics


def publish(trainer, **card_settings):
    """After training, the Hub-ready folder with its model card; with --push_to_hub, the upload (through
    Trainer.push_to_hub, which writes the same card)."""
    trainer.card_settings = card_settings
    if trainer.args.do_train:
        save_hub_ready(trainer, **card_settings)
    if trainer.args.push_to_hub:
        trainer.push_to_hub()


def dataset_name(data_args, default: Path) -> str:
    """What the model card names as the training data."""
    if data_args.dataset_name:
        return data_args.dataset_name
    if data_args.train_file:
        return str(Path(data_args.train_file).parent)
    return f"{default.parent.name}/{default.name}"  # the bundled data, as the checkout names it: data/<name>


def save_hub_ready(trainer, **card_settings):
    """Weights, config, code (for trust_remote_code), tokenizer and the model card, in the output folder."""
    trainer.save_model()
    write_card(trainer, **card_settings)


def write_card(trainer, *, task: str, dataset: str, metrics: dict, base_model: str | None):
    if trainer.is_world_process_zero():
        write_model_card(
            trainer.args.output_dir,
            model=trainer.accelerator.unwrap_model(trainer.model),
            task=task,
            dataset=dataset,
            metrics=metrics,
            hyperparameters=hyperparameters(trainer.args),
            base_model=base_model,
        )


class SplitOrderTrainerMixin:
    """Evaluation and prediction read a split in its order, so that a predictions file lines up with its data file:
    with --train_sampling_strategy group_by_length transformers' Trainer groups their batches by length too."""

    def _get_eval_sampler(self, eval_dataset):
        grouped = self.args.train_sampling_strategy == "group_by_length"
        if not grouped or self.args.world_size > 1 or eval_dataset is None or not has_length(eval_dataset):
            return super()._get_eval_sampler(eval_dataset)
        return SequentialSampler(eval_dataset)


class ModelCardTrainerMixin:
    """Trainer.push_to_hub writes its own generic README.md before uploading; write the Fastformer card."""

    card_settings: dict | None = None

    def create_model_card(self, **kwargs):
        if self.card_settings is not None:
            write_card(self, **self.card_settings)
