"""`fastformer-convert`: a pretrained BERT-family checkpoint (a sentence-transformers model or a fine-tuned classifier
too) as a pretrained Fastformer: map the shared weights (`fastformer.conversion`), transfer the attention from the
source on --distill_file's texts (`fastformer.distillation`, on Trainer; a rerun resumes it) and save the folder."""

import gzip
import json
import logging
import shlex
import shutil
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from huggingface_hub import ModelCard
from huggingface_hub.errors import HfHubHTTPError, StrictDataclassError
from safetensors.torch import load_model, save_model
from transformers import (
    AutoTokenizer,
    DataCollatorWithPadding,
    HfArgumentParser,
    PreTrainedTokenizerBase,
    SchedulerType,
    TrainingArguments,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

from fastformer.cli import check_weights_readable, fail, installed, parse_args, require_extra, setup_logging
from fastformer.conversion import (
    CROSS_ATTENTION_INITS,
    TASKS,
    convert_bert,
    copy_encoder_layers,
    load_bert_source,
    sentence_transformers_files,
    source_positions,
)
from fastformer.distillation import (
    MATCHED,
    STAGES,
    embedding_cosine,
    prediction_agreement,
    problem_type,
    transfer_attention,
    transfer_errors,
)
from fastformer.model_card import hyperparameters, write_conversion_card

if installed("train"):  # else main() answers --help, and stops a run at once with one line naming the extra
    import datasets

logger = logging.getLogger(__name__)
DISTILLATION_DIR = "distillation"  # inside --output_dir while the transfer runs
FINISHED, FINISHED_STUDENT = "finished.json", "student.safetensors"  # a stage's report and student, once it ends


@dataclass
class ConversionArguments:
    model_name_or_path: str = field(
        metadata={"help": "The BERT-family checkpoint to convert (also sentence-transformers): a folder or Hub id."}
    )
    task: str | None = field(
        default=None,
        metadata={
            "help": "encoder: a FastformerModel; classification: a FastformerForSequenceClassification with the "
            "source's head (default for a *ForSequenceClassification source, else encoder); seq2seq: an "
            "encoder-decoder warm-started from the source.",
            "choices": list(TASKS),
        },
    )
    cross_attention_init: str = field(
        default="random",
        metadata={
            "help": "With --task seq2seq: random, or self_attention (from the same source layer's self-attention).",
            "choices": list(CROSS_ATTENTION_INITS),
        },
    )
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "Positions of the converted model (default: the source's); more repeat them."}
    )
    num_attention_heads: int | None = field(
        default=None, metadata={"help": "Heads of the converted attention (default: the source's)."}
    )
    cls_attention_heads: int | None = field(
        default=None,
        metadata={"help": "Heads of a classifier's [CLS] softmax attention in the last layer (default: the source's)."},
    )
    base_model: str | None = field(
        default=None, metadata={"help": "The source's Hub id, for the model card, when it is read from a folder."}
    )
    overwrite_output_dir: bool = field(
        default=False, metadata={"help": "Replace what --output_dir holds (a finished folder is kept otherwise)."}
    )
    cache_dir: str | None = field(default=None, metadata={"help": "Where to cache Hub downloads."})
    model_revision: str = field(default="main", metadata={"help": "Branch, tag or commit of the checkpoint."})
    token: str | None = field(default=None, metadata={"help": "Hub token (default: the cached login)."})


@dataclass
class DistillationArguments:
    distill_file: str | None = field(
        default=None, metadata={"help": "Unlabeled text (json/jsonl, or txt; maybe .gz) for the attention transfer."}
    )
    text_column: str = field(default="text", metadata={"help": "The text column of --distill_file."})
    label_column: str | None = field(
        default=None, metadata={"help": "A classifier's labels (names or ids; null: none) in --distill_file, if any."}
    )
    logit_distillation_weight: float | None = field(
        default=None, metadata={"help": "Weight of the teacher's logits in the end-to-end stage (classifiers: 1)."}
    )
    temperature: float = field(default=2.0, metadata={"help": "Temperature of the logit distillation's KL."})
    hidden_distillation_weight: float = field(
        default=1.0, metadata={"help": "Weight of the teacher's hidden states in the end-to-end stage."}
    )
    max_seq_length: int = field(default=256, metadata={"help": "Distillation texts are truncated to this many tokens."})
    mask_probability: float = field(
        default=0.0, metadata={"help": "Share of the training texts' tokens masked, anew in every batch (0: none)."}
    )
    validation_split_percentage: int = field(
        default=2, metadata={"help": "Held-out share of --distill_file on which the per-layer errors are reported."}
    )
    max_eval_samples: int | None = field(default=128, metadata={"help": "Keep at most N held-out texts."})
    end_to_end_steps: int = field(default=350, metadata={"help": "Steps of the end-to-end stage (0: skip it)."})
    end_to_end_learning_rate: float = field(
        default=3e-4, metadata={"help": "Learning rate of the end-to-end stage (--learning_rate: the layerwise one)."}
    )
    end_to_end_matched: str | None = field(
        default=None,
        metadata={
            "help": "What the end-to-end stage matches of the teacher: its last hidden state and the sentence "
            "embedding pooled from it (pooled; an encoder's default; a classifier's head pools its own), its last "
            "hidden state (last; a classifier's default), or every layer's (all).",
            "choices": list(MATCHED),
        },
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenization."})


@dataclass
class DistillationTrainingArguments(TrainingArguments):
    """TrainingArguments with this command's defaults; `--max_steps` and `--learning_rate` are the layerwise stage's."""

    max_steps: int = field(default=500, metadata={"help": "Steps of the layerwise stage."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Learning rate of the layerwise stage."})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "Batch size per device."})
    lr_scheduler_type: SchedulerType | str = field(default="cosine", metadata={"help": "Learning rate schedule."})
    warmup_steps: float = field(default=0.1, metadata={"help": "Warm-up steps, or a fraction (< 1) of the steps."})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay."})
    logging_steps: float = field(default=50, metadata={"help": "Log the loss every N steps."})
    save_steps: float = field(default=100, metadata={"help": "Checkpoint every N steps (to resume)."})
    save_total_limit: int | None = field(default=1, metadata={"help": "Checkpoints kept per stage."})
    report_to: None | str | list[str] = field(default="none", metadata={"help": "Where to report the logs."})


ARGUMENTS = (ConversionArguments, DistillationArguments, DistillationTrainingArguments)


def prepare_output_dir(output_dir: Path, overwrite: bool, run: dict) -> None:
    """Refuse to replace a finished folder, or an unfinished transfer of another `run` (the same one resumes), without
    --overwrite_output_dir, which deletes them."""
    work = output_dir / DISTILLATION_DIR
    finished = (output_dir / "config.json").exists()
    if finished and not overwrite:
        fail(f"--output_dir {output_dir} already holds a converted model: pass --overwrite_output_dir to replace it")
    recorded = work / "run.json"
    if work.exists() and not overwrite:
        former = json.loads(recorded.read_text()) if recorded.exists() else None
        if former != run:
            fail(
                f"{work} holds the checkpoints of another conversion ({former}); pass --overwrite_output_dir to "
                "start afresh, or the same arguments to resume it"
            )
    if overwrite:
        shutil.rmtree(work, ignore_errors=True)
        for path in ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json"):
            (output_dir / path).unlink(missing_ok=True)
        for folder in output_dir.glob("*_Pooling"):
            shutil.rmtree(folder)
    work.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(run, indent=2) + "\n")


def load_texts(distill_args, tokenizer, training_args, seed: int, label2id: dict | None = None):
    """--distill_file's texts, tokenized and split into training and held-out texts; with --label_column, "labels"."""
    path = distill_args.distill_file
    suffixes = [suffix for suffix in Path(path).suffixes if suffix != ".gz"]
    loader = {".txt": "text", ".json": "json", ".jsonl": "json"}.get(suffixes[-1] if suffixes else "")
    if loader is None:
        fail(f"--distill_file {path}: use a .json, .jsonl or .txt file (optionally .gz)")
    if not Path(path).is_file():
        fail(f"--distill_file {path}: no such file")
    with (gzip.open if path.endswith(".gz") else open)(path, "rt") as file:
        if not any(line.strip() for line in file):
            fail(f"--distill_file {path} is empty")
    raw = datasets.load_dataset(loader, data_files=path, split="train")
    column = "text" if loader == "text" else distill_args.text_column
    if column not in raw.column_names:
        fail(f"--text_column {column!r} is not a column of --distill_file; it has {raw.column_names}")
    raw = raw.filter(lambda row: bool(row[column] and row[column].strip()))
    if len(raw) < 2:
        fail(
            f"--distill_file {path} has {len(raw)} texts in --text_column {column!r}; the distillation needs 2 or more"
        )
    if distill_args.label_column:
        raw = with_label_ids(raw, distill_args.label_column, label2id)
    held_out = max(1, len(raw) * distill_args.validation_split_percentage // 100)
    splits = raw.train_test_split(test_size=held_out, seed=seed, shuffle=True)

    def tokenize(batch):
        return tokenizer(batch[column], truncation=True, max_length=distill_args.max_seq_length)

    with training_args.main_process_first(desc="tokenizing the distillation texts"):
        dropped = [name for name in raw.column_names if name != "labels" or not distill_args.label_column]
        tokenized = splits.map(
            tokenize, batched=True, remove_columns=dropped, num_proc=distill_args.preprocessing_num_workers
        )
    evaluation = tokenized["test"].select(range(min(len(tokenized["test"]), distill_args.max_eval_samples or held_out)))
    return tokenized["train"], evaluation


def with_label_ids(raw, column: str, label2id: dict):
    """`raw` with "labels": the class id of each row's `column`, a name of `label2id` or an id (null: -100)."""
    if column not in raw.column_names:
        fail(f"--label_column {column!r} is not a column of --distill_file; it has {raw.column_names}")
    ids = {**label2id, **{index: index for index in label2id.values()}}
    unknown = sorted({str(label) for label in raw[column] if label is not None and label not in ids})
    if unknown:
        fail(f"--label_column {column!r} holds {unknown[:5]}: neither the teacher's labels {list(label2id)} nor ids")
    return raw.map(lambda row: {"labels": -100 if row[column] is None else ids[row[column]]})


def batches(dataset, tokenizer, size: int):
    collate = DataCollatorWithPadding(tokenizer)
    return [
        collate([dataset[index] for index in range(start, min(start + size, len(dataset)))])
        for start in range(0, len(dataset), size)
    ]


@dataclass
class MaskingCollator:
    """`DataCollatorWithPadding`, then each real, non-special token replaced by the mask token with `probability`."""

    tokenizer: PreTrainedTokenizerBase
    probability: float

    def __call__(self, features: list[dict]) -> dict:
        batch = DataCollatorWithPadding(self.tokenizer)(features)
        input_ids = batch["input_ids"]
        special = torch.isin(input_ids, torch.tensor(self.tokenizer.all_special_ids))
        masked = (torch.rand(input_ids.shape) < self.probability) & ~special & batch["attention_mask"].bool()
        batch["input_ids"] = input_ids.masked_fill(masked, self.tokenizer.mask_token_id)
        return batch


def measure(student, teacher, held_out, head=None) -> dict:
    """The agreement with the teacher on the held-out texts; a classifier's (`head`: the teacher's) predictions too."""
    errors = transfer_errors(student, teacher, held_out)
    measured = {**errors, "embedding_cosine": embedding_cosine(student, teacher, held_out)}
    if head is not None and problem_type(head.config) != "regression":
        measured["agreement"] = prediction_agreement(student, teacher, head, held_out)
    return measured


def distillation_losses(distill_args, head) -> dict:
    """`AttentionTransfer`'s losses as the flags set them (`head`: a classifier source's); stops on a bad flag."""
    losses = {"hidden_weight": distill_args.hidden_distillation_weight}
    if head is None:
        if distill_args.logit_distillation_weight is not None or distill_args.label_column:
            fail(
                "--logit_distillation_weight and --label_column are a classifier's: --model_name_or_path is no "
                "fine-tuned *ForSequenceClassification"
            )
        return losses
    if distill_args.temperature <= 0:
        fail(f"--temperature must be positive, got {distill_args.temperature}")
    if distill_args.label_column and problem_type(head.config) != "single_label_classification":
        fail(
            f"--label_column takes single-label class labels; the teacher's problem_type is {head.config.problem_type}"
        )
    weight = 1.0 if distill_args.logit_distillation_weight is None else distill_args.logit_distillation_weight
    return losses | dict(teacher_head=head, logit_weight=weight, temperature=distill_args.temperature)


def distill(student, teacher, tokenizer, distill_args, training_args, output_dir: Path, losses: dict) -> dict:
    """Both transfer stages on --distill_file; the per-layer errors on the held-out texts before and after each."""
    masking = distill_args.mask_probability
    if not 0 <= masking < 1:
        fail(f"--mask_probability must be at least 0 and below 1, got {masking}")
    if masking and tokenizer.mask_token_id is None:
        fail(f"--mask_probability {masking} needs a mask token, and the source's tokenizer has none")
    head = losses.get("teacher_head")
    label2id = head.config.label2id if head is not None else None
    train, held_out = load_texts(distill_args, tokenizer, training_args, training_args.seed, label2id)
    evaluation = batches(held_out, tokenizer, training_args.per_device_eval_batch_size)
    report = {"train_texts": len(train), "held_out_texts": len(held_out), "stages": {}}
    report["before"] = measure(student, teacher, evaluation, head)
    print_errors("before the transfer", report["before"])
    settings = {
        "layerwise": dict(max_steps=training_args.max_steps, learning_rate=training_args.learning_rate),
        "end_to_end": dict(
            max_steps=distill_args.end_to_end_steps, learning_rate=distill_args.end_to_end_learning_rate
        ),
    }
    # the layerwise stage matches every attention sub-layer; the end-to-end stage, these and a classifier's logits
    matched = distill_args.end_to_end_matched or ("pooled" if head is None else "last")
    end_to_end = {"matched": matched, **{name: value for name, value in losses.items() if name != "teacher_head"}}
    if head is not None:
        end_to_end["label_column"] = distill_args.label_column
    collator = MaskingCollator(tokenizer, masking) if masking else DataCollatorWithPadding(tokenizer)
    for stage in STAGES:
        if settings[stage]["max_steps"] <= 0:
            continue
        stage_dir = output_dir / DISTILLATION_DIR / stage
        finished = stage_dir / FINISHED
        if finished.exists():  # by a former run: its student and report (Trainer would train one more step)
            check_weights_readable(stage_dir / FINISHED_STUDENT)
            load_model(student, stage_dir / FINISHED_STUDENT)
            report["stages"][stage] = json.loads(finished.read_text())
            logger.info(f"The {stage} stage finished before this run: its student is read back")
            continue
        stage_args = replace(training_args, output_dir=str(stage_dir), **settings[stage])
        last = get_last_checkpoint(str(stage_dir)) if stage_dir.is_dir() else None
        if last is not None:
            check_weights_readable(last)
            logger.info(f"Resuming the {stage} stage from {last}")
        started = time.perf_counter()
        result = transfer_attention(student, teacher, stage, train, stage_args, collator, last, matched, **losses)
        report["stages"][stage] = {
            **settings[stage],
            **(end_to_end if stage == "end_to_end" else {}),
            "train_loss": result.training_loss,
            "seconds": round(time.perf_counter() - started, 1),
            "after": measure(student, teacher, evaluation, head),
        }
        print_errors(f"after the {stage} stage", report["stages"][stage]["after"])
        if training_args.should_save:
            save_model(student, str(stage_dir / FINISHED_STUDENT))
            finished.write_text(json.dumps(report["stages"][stage], indent=2) + "\n")
    return report


def print_errors(when: str, measured: dict) -> None:
    """The per-layer errors on the held-out texts, printed whatever the log level (as Trainer.log_metrics)."""
    print(f"***** agreement with the teacher, {when} *****")
    for name in ("attention", "hidden"):
        print(f"  {name + ' error per layer':28} = {', '.join(f'{error:.4f}' for error in measured[name])}")
    print(f"  {'embedding cosine':28} = {measured['embedding_cosine']:.4f}")


def save_sentence_transformers_files(source, output_dir: Path, max_seq_length: int) -> None:
    """A sentence-transformers source's modules and settings next to the weights (a `SentenceTransformer` folder)."""
    for path, text in sentence_transformers_files(source, max_seq_length).items():
        target = output_dir / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def main(args: list[str] | None = None):
    require_extra("fastformer-convert", "train", args, print_help=lambda: HfArgumentParser(ARGUMENTS).print_help())
    started = time.perf_counter()
    program = sys.argv[0] if args is None else Path(__file__).name
    launcher = ["python", program] if program.endswith(".py") else [Path(program).name]  # a script, or the command
    command = shlex.join([*launcher, *(args or sys.argv[1:])])
    conversion_args, distill_args, training_args = parse_args(ARGUMENTS, args)
    setup_logging(training_args)
    output_dir = Path(training_args.output_dir)
    set_seed(training_args.seed)
    hub = dict(
        cache_dir=conversion_args.cache_dir, revision=conversion_args.model_revision, token=conversion_args.token
    )
    try:
        source = load_bert_source(conversion_args.model_name_or_path, task=conversion_args.task, **hub)
    except ValueError as error:
        fail(f"--model_name_or_path {error}")
    except OSError as error:
        fail(str(error))
    tokenizer = AutoTokenizer.from_pretrained(conversion_args.model_name_or_path, subfolder=source.subfolder, **hub)
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id  # a BERT tokenizer's sequence start and end
    seq2seq = source.task == "seq2seq"
    special_ids = dict(bos_token_id=cls, decoder_start_token_id=cls, eos_token_id=sep) if seq2seq else {}
    try:
        model = convert_bert(
            source.model,
            pooler_type=source.pooler_type,
            max_position_embeddings=conversion_args.max_position_embeddings,
            task=source.task,
            cross_attention_init=conversion_args.cross_attention_init,
            head=source.head,
            num_attention_heads=conversion_args.num_attention_heads,
            cls_attention_heads=conversion_args.cls_attention_heads,
            **special_ids,
        )
    except (ValueError, StrictDataclassError) as error:  # the latter: a config's fields that do not fit together
        fail(str(error))
    tokenizer.model_max_length = model.config.max_position_embeddings

    student = model.get_encoder() if seq2seq else model
    report = None
    if distill_args.distill_file:
        losses = distillation_losses(distill_args, source.head)
        if distill_args.max_seq_length > source_positions(source.model.config):
            fail(
                f"--max_seq_length {distill_args.max_seq_length} is more than the teacher's "
                f"{source_positions(source.model.config)} positions, which it reads the texts with"
            )
        run = dict(
            source=conversion_args.model_name_or_path,
            revision=conversion_args.model_revision,
            task=source.task,
            cross_attention_init=conversion_args.cross_attention_init,
            max_position_embeddings=model.config.max_position_embeddings,
            num_attention_heads=model.config.num_attention_heads,
            cls_attention_heads=model.config.cls_attention_heads,
            distill_file=str(distill_args.distill_file),
            text_column=distill_args.text_column,
            max_seq_length=distill_args.max_seq_length,
            seed=training_args.seed,
            label_column=distill_args.label_column,
            **{name: value for name, value in losses.items() if name != "teacher_head"},
        )
        if training_args.should_save:
            prepare_output_dir(output_dir, conversion_args.overwrite_output_dir, run)
        dtype = model.dtype
        if source.head is not None:
            source.head.float()
        report = distill(
            student.float(), source.model.float(), tokenizer, distill_args, training_args, output_dir, losses
        )
        if seq2seq:
            copy_encoder_layers(student, model.get_decoder().layers)
        model.to(device="cpu", dtype=dtype)  # as the source: the transfer ran in float32, maybe on an accelerator
    elif training_args.should_save:
        prepare_output_dir(output_dir, conversion_args.overwrite_output_dir, {})

    if training_args.should_save:
        model.save_pretrained(output_dir)
        tokenizer.save_pretrained(output_dir)
        sentence_transformers = bool(source.sentence_transformers) and not seq2seq
        if sentence_transformers:
            save_sentence_transformers_files(source, output_dir, model.config.max_position_embeddings)
        settings = {
            "command": command,
            "seconds": round(time.perf_counter() - started, 1),
            "threads": torch.get_num_threads(),  # the intra-op threads that the seconds ran on
            "source": conversion_args.model_name_or_path,
            "source_model_type": source.model_type,
            "task": source.task,
            "cross_attention_init": conversion_args.cross_attention_init,
            "max_position_embeddings": model.config.max_position_embeddings,
            "source_max_position_embeddings": source_positions(source.model.config),
            "distill_file": distill_args.distill_file,
            "max_seq_length": distill_args.max_seq_length if distill_args.distill_file else None,
            "hyperparameters": hyperparameters(training_args) if distill_args.distill_file else None,
            "distillation": report,
        }
        (output_dir / "conversion.json").write_text(json.dumps(settings, indent=2) + "\n")
        write_conversion_card(
            output_dir,
            model=model,
            settings=settings,
            base_model=conversion_args.base_model,
            license=source_license(source.name_or_path, token=conversion_args.token),
            sentence_transformers=sentence_transformers,
        )
        shutil.rmtree(output_dir / DISTILLATION_DIR, ignore_errors=True)
        logger.info(f"Saved the converted model in {output_dir}")


def source_license(name_or_path: str, token=None) -> str | None:
    """The license the source's model card declares; None without a readable card."""
    path = Path(name_or_path) / "README.md"
    if Path(name_or_path).is_dir() and not path.exists():  # a local folder without a card: nothing to ask the Hub
        return None
    try:
        card = ModelCard.load(path) if path.exists() else ModelCard.load(name_or_path, token=token)
    except (OSError, ValueError, HfHubHTTPError):
        return None
    return card.data.license


if __name__ == "__main__":
    torch.set_float32_matmul_precision("high")
    main()
