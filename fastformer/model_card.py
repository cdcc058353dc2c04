"""The model cards (README.md) of trained and converted checkpoints, rendered from the package's model_cards/
templates by `ModelCard.from_template` (jinja2, the [train] extra) with `ModelCardData` metadata."""

from importlib.resources import files
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

TEMPLATES = files("fastformer") / "model_cards"  # package data: read from an installed wheel as from a checkout

# task (the pipeline tag) -> (Auto class that loads the checkpoint, task name in the model-index)
TASKS = {
    "text-classification": ("AutoModelForSequenceClassification", "Text Classification"),
    "summarization": ("AutoModelForSeq2SeqLM", "Summarization"),
    "fill-mask": ("AutoModelForMaskedLM", "Fill-Mask"),
}

# eval_results.json's key less "eval_" -> the model-index's (type, name, config); other keys: the results table only
QUALITY_METRICS = {
    "accuracy": ("accuracy", "Accuracy", None),
    "f1_macro": ("f1", "macro-F1", "macro"),
    "rouge1": ("rouge", "ROUGE-1", None),
    "rouge2": ("rouge", "ROUGE-2", None),
    "rougeL": ("rouge", "ROUGE-L", None),
    "rougeLsum": ("rouge", "ROUGE-Lsum", None),
    "loss": ("loss", "Loss", None),
    "perplexity": ("perplexity", "Perplexity", None),
}

# config fields in the card's architecture table, where the config has them; the decoder's for encoder-decoders only
ARCHITECTURE_FIELDS = (
    *("hidden_size", "num_hidden_layers", "num_decoder_layers", "decoder_layers", "num_attention_heads"),
    *("intermediate_size", "max_position_embeddings", "vocab_size"),
)
DECODER_FIELDS = ("num_decoder_layers", "decoder_layers")


def write_model_card(
    output_dir, *, model, task, dataset, metrics, hyperparameters, base_model=None, license="apache-2.0"
) -> ModelCard:
    """Writes and returns `output_dir`/README.md, the card of `model` (a Fastformer or a baseline) trained for `task`
    (of TASKS) on `dataset`, with its `metrics` (eval_results.json's), `hyperparameters` (name -> value), the
    `base_model` it was fine-tuned from (None: from scratch) and `license`."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {tuple(TASKS)}, got {task!r}")
    auto_class, task_name = TASKS[task]
    config = model.config
    is_fastformer = config.model_type == "fastformer"
    model_name = Path(output_dir).resolve().name

    eval_results = [
        EvalResult(
            task_type=task,
            task_name=task_name,
            dataset_type=dataset,
            dataset_name=dataset,
            metric_type=known[0],
            metric_name=known[1],
            metric_config=known[2],
            metric_value=float(value),  # a plain float: numpy scalars do not dump to YAML
        )
        for key, value in metrics.items()
        if (known := _quality_metric(key)) is not None
    ]
    tags = ["fastformer", "additive-attention", task] if is_fastformer else [config.model_type, task]
    # the Hub takes only a model id as `base_model` metadata: a local folder is named in the text only
    hub_base_model = base_model if base_model and not Path(base_model).exists() else None
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="transformers",
        pipeline_tag=task,
        tags=tags,
        datasets=[dataset],
        metrics=list(dict.fromkeys(result.metric_type for result in eval_results)) or None,
        base_model=hub_base_model,
        model_name=model_name,
        eval_results=eval_results or None,
    )

    architecture = [
        (field, getattr(config, field))
        for field in ARCHITECTURE_FIELDS
        if getattr(config, field, None) is not None and (config.is_encoder_decoder or field not in DECODER_FIELDS)
    ]
    labels = [config.id2label[index] for index in sorted(config.id2label)] if task == "text-classification" else []
    card = ModelCard.from_template(
        card_data,
        template_str=(TEMPLATES / "fastformer.md").read_text(encoding="utf-8"),
        model_name=model_name,  # the card data's model_name goes into its model-index, not to the template
        base_model=base_model,
        dataset=dataset,
        is_fastformer=is_fastformer,
        config=config,
        model_class=type(model).__name__,
        auto_class=auto_class,
        architecture=architecture,
        num_parameters=f"{model.num_parameters():,}",
        num_parameters_without_embeddings=f"{model.num_parameters(exclude_embeddings=True):,}",
        labels=labels,
        # an EncoderDecoderModel (BERT2BERT) keeps its encoder's settings in config.encoder
        max_positions=getattr(config, "max_position_embeddings", None)
        or getattr(getattr(config, "encoder", None), "max_position_embeddings", None),
        hyperparameters=[(name, _cell(value)) for name, value in hyperparameters.items()],
        results=[(_metric_label(key), _cell(value, decimals=4)) for key, value in metrics.items()],
    )
    card.save(Path(output_dir) / "README.md")
    return card


def hyperparameters(args) -> dict:
    """The card's hyperparameters table (name -> value) from `args`, a run's TrainingArguments."""
    return {
        "learning_rate": args.learning_rate,
        "train_batch_size": args.per_device_train_batch_size,
        "eval_batch_size": args.per_device_eval_batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "total_train_batch_size": (
            args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        ),
        "num_devices": args.world_size,
        "seed": args.seed,
        "optimizer": getattr(args.optim, "value", args.optim),
        "lr_scheduler_type": getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type),
        "warmup_steps": args.warmup_steps,
        "num_epochs": args.num_train_epochs,
        "max_steps": args.max_steps,
        "weight_decay": args.weight_decay,
    }


def _quality_metric(key):
    """(metric type, name, config) of the metrics key `key`, or None if it is not a quality metric."""
    return QUALITY_METRICS.get(key.removeprefix("eval_"))


def _metric_label(key):
    known = _quality_metric(key)
    return known[1] if known else key


def _cell(value, decimals=None):
    """`value` as the text of a Markdown table cell; floats rounded to `decimals` if given."""
    if decimals is not None and isinstance(value, float):
        value = round(value, decimals)
    return str(value).replace("|", "\\|").replace("\n", " ")


def write_conversion_card(
    output_dir, *, model, settings: dict, base_model=None, license=None, sentence_transformers=False
) -> ModelCard:
    """Writes `output_dir`/README.md, the card of a Fastformer converted by fastformer-convert, and returns it.
    `settings`: what the command records in conversion.json; `base_model`: the source's Hub id (default: the source,
    unless a local path); `license`: the source's; `sentence_transformers`: the folder is such a model too."""
    source = settings["source"]
    base_model = base_model or (None if Path(source).exists() else source)
    seq2seq, classifier = model.config.is_encoder_decoder, settings.get("task") == "classification"
    tags = ["fastformer", "additive-attention", f"converted-from-{settings.get('source_model_type') or 'bert'}"]
    if sentence_transformers:
        tags.append("sentence-transformers")
    if classifier:
        tags.append("text-classification")
    pipeline_tag = "sentence-similarity" if sentence_transformers else "feature-extraction"
    card_data = ModelCardData(
        language="en",
        license=license,
        library_name="sentence-transformers" if sentence_transformers else "transformers",
        pipeline_tag="text2text-generation" if seq2seq else "text-classification" if classifier else pipeline_tag,
        tags=tags,
        base_model=base_model,
        datasets=None,
    )
    distillation = settings.get("distillation") or {}
    stages = []
    if distillation:
        after = [("conversion alone", distillation["before"])]
        after += [(name, stage["after"]) for name, stage in distillation["stages"].items()]
        for name, errors in after:
            row = {key: ", ".join(f"{error:.3f}" for error in errors[key]) for key in ("attention", "hidden")}
            row["agreement"] = f"{errors['agreement']:.3f}" if "agreement" in errors else "-"  # a classifier's
            stages.append((name, {**row, "cosine": f"{errors['embedding_cosine']:.3f}"}))
    card = ModelCard.from_template(
        card_data,
        template_str=(TEMPLATES / "converted.md").read_text(encoding="utf-8"),
        model_name=Path(output_dir).resolve().name,
        source=base_model or source,
        config=model.config,
        model_class=type(model).__name__,
        auto_class="AutoModelForSeq2SeqLM"
        if seq2seq
        else "AutoModelForSequenceClassification"
        if classifier
        else "AutoModel",
        classifier=classifier,
        sentence_transformers=sentence_transformers,
        settings=settings,
        stages=stages,
        num_parameters=f"{model.num_parameters():,}",
    )
    card.save(Path(output_dir) / "README.md")
    return card
