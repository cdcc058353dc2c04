"""A pretrained BERT-family checkpoint (`SOURCE_MODELS`, also as a sentence-transformers model) as a Fastformer: the
weights the two architectures share, mapped exactly. A fine-tuned `*ForSequenceClassification` becomes a
`FastformerForSequenceClassification` with its head and labels; `fastformer.distillation` then learns the attention."""

import json
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForSequenceClassification,
    BertConfig,
    BertModel,
    DistilBertModel,
    ElectraModel,
    PreTrainedModel,
    RobertaModel,
    XLMRobertaModel,
)
from transformers.utils import cached_file

from .configuration_fastformer import COPY_FIELDS, FastformerConfig, FastformerCopyConfig
from .modeling_fastformer import (
    FastformerForConditionalGeneration,
    FastformerForSequenceClassification,
    FastformerModel,
    FastformerPooler,
)

# model_type -> the source's model class (its encoder, no task head)
SOURCE_MODELS = {
    "bert": BertModel,
    "roberta": RobertaModel,
    "xlm-roberta": XLMRobertaModel,
    "distilbert": DistilBertModel,
    "electra": ElectraModel,
}
SUPPORTED_MODEL_TYPES = tuple(SOURCE_MODELS)
# model_type -> its *ForSequenceClassification's head: the pooler_type, the dense layer's and the classifier's modules
CLASSIFIER_HEADS = {
    "bert": ("cls_tanh", "bert.pooler.dense", "classifier"),
    "roberta": ("cls_tanh", "classifier.dense", "classifier.out_proj"),
    "xlm-roberta": ("cls_tanh", "classifier.dense", "classifier.out_proj"),
    "distilbert": ("cls_relu", "pre_classifier", "classifier"),
    "electra": ("cls_gelu", "classifier.dense", "classifier.out_proj"),
}
# what `architectures` names end with where the weights past the encoder are a pretraining head (or none)
ENCODER_ARCHITECTURES = ("Model", "ForMaskedLM", "ForPreTraining", "ForCausalLM", "ForNextSentencePrediction")
# the config fields a converted classifier takes from the source's
LABEL_FIELDS = ("id2label", "label2id", "problem_type")
# the sources whose real tokens' positions start at padding_idx + 1 (rows up to padding_idx: padding, unused)
POSITIONS_AFTER_PADDING_IDX = ("roberta", "xlm-roberta")
# config fields that BertConfig and FastformerConfig share, with one meaning: the converted model takes the source's
SHARED_CONFIG_FIELDS = (
    *("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "hidden_act"),
    *("hidden_dropout_prob", "layer_norm_eps", "initializer_range", "pad_token_id"),
)
TASKS = ("encoder", "classification", "seq2seq")
# an encoder-decoder's cross-attention starts random, or as the same layer's self-attention (Rothe et al., 2019)
CROSS_ATTENTION_INITS = ("random", "self_attention")
# sentence-transformers' pooling modes (6.x names, or flags pooling_mode_<name>) -> the same Fastformer pooler
SENTENCE_TRANSFORMERS_POOLING = {"mean": "mean", "mean_tokens": "mean", "cls": "cls", "cls_token": "cls"}
# sentence-transformers module class (by name: its import path moved in 6.0) -> its settings file in its folder
SENTENCE_TRANSFORMERS_SETTINGS = {
    "Transformer": "sentence_bert_config.json",
    "Pooling": "config.json",
    "Normalize": None,
}


@dataclass
class BertSource:
    """A BERT-family checkpoint to convert: the model (a DistilBERT as its `BertModel`) and what else it carries."""

    name_or_path: str
    model: PreTrainedModel
    model_type: str = "bert"  # the checkpoint's (a DistilBERT's model is a BertModel)
    pooler_type: str = "cls"  # the first token, as BERT's pooler (less its dense + tanh); or the source's pooling
    subfolder: str = ""  # where a sentence-transformers source keeps the BERT model and its tokenizer
    sentence_transformers: dict = field(default_factory=dict)  # file name -> text of its files (modules.json, ...)
    task: str = "encoder"  # "classification": a sequence classifier, whose head is `head`
    head: "ClassifierHead | None" = None


class ClassifierHead(nn.Module):
    """A sequence classifier's head as Fastformer computes it: `FastformerPooler` ("cls_*"), then the classifier;
    `config` holds its pooler_type and labels. (B, N, C) hidden states -> logits."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.config = config
        self.pooler = FastformerPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden_states, attention_mask=None) -> torch.Tensor:
        return self.classifier(self.pooler(hidden_states, attention_mask))


def _module_class(module: dict) -> str:
    return module["type"].rsplit(".", 1)[-1]


def _sentence_transformers_files(name_or_path: str, **hub_kwargs) -> dict[str, str]:
    """A sentence-transformers checkpoint's own files (path -> text); {} for a plain transformers checkpoint."""

    def read(path):
        found = cached_file(name_or_path, path, _raise_exceptions_for_missing_entries=False, **hub_kwargs)
        if found is None:
            return None
        with open(found) as file:
            return file.read()

    modules = read("modules.json")
    if modules is None:
        return {}
    paths = ["config_sentence_transformers.json"]
    for module in json.loads(modules):
        name = SENTENCE_TRANSFORMERS_SETTINGS.get(_module_class(module))
        if name is not None:
            folder = module.get("path", "")
            paths.append(f"{folder}/{name}" if folder else name)
    files = {"modules.json": modules} | {path: read(path) for path in paths}
    return {path: text for path, text in files.items() if text is not None}


def position_offset(config) -> int:
    """The source's position row of a sequence's first token: padding_idx + 1 for RoBERTa and XLM-R, else 0."""
    return config.pad_token_id + 1 if config.model_type in POSITIONS_AFTER_PADDING_IDX else 0


def source_positions(config) -> int:
    """How many tokens the source reads: its position rows less those before the first token's."""
    return config.max_position_embeddings - position_offset(config)


@torch.no_grad()
def bert_from_distilbert(distilbert: DistilBertModel) -> BertModel:
    """The `BertModel` (in eval mode) that computes what `distilbert` does: the same layer under other names."""
    source = distilbert.config
    config = BertConfig(
        vocab_size=source.vocab_size,
        hidden_size=source.dim,
        num_hidden_layers=source.n_layers,
        num_attention_heads=source.n_heads,
        intermediate_size=source.hidden_dim,
        hidden_act=source.activation,
        hidden_dropout_prob=source.dropout,
        attention_probs_dropout_prob=source.attention_dropout,
        max_position_embeddings=source.max_position_embeddings,
        type_vocab_size=1,
        layer_norm_eps=1e-12,
        initializer_range=source.initializer_range,
        pad_token_id=source.pad_token_id,
    )
    bert = BertModel(config, add_pooling_layer=False).to(distilbert.dtype)
    embeddings = distilbert.embeddings
    bert.embeddings.word_embeddings.load_state_dict(embeddings.word_embeddings.state_dict())
    bert.embeddings.position_embeddings.load_state_dict(embeddings.position_embeddings.state_dict())
    bert.embeddings.token_type_embeddings.weight.zero_()
    bert.embeddings.LayerNorm.load_state_dict(embeddings.LayerNorm.state_dict())
    for block, layer in zip(distilbert.transformer.layer, bert.encoder.layer, strict=True):
        for name, theirs in (("query", "q_lin"), ("key", "k_lin"), ("value", "v_lin")):
            getattr(layer.attention.self, name).load_state_dict(getattr(block.attention, theirs).state_dict())
        layer.attention.output.dense.load_state_dict(block.attention.out_lin.state_dict())
        layer.attention.output.LayerNorm.load_state_dict(block.sa_layer_norm.state_dict())
        layer.intermediate.dense.load_state_dict(block.ffn.lin1.state_dict())
        layer.output.dense.load_state_dict(block.ffn.lin2.state_dict())
        layer.output.LayerNorm.load_state_dict(block.output_layer_norm.state_dict())
    return bert.eval()


def source_task(config, name_or_path: str, task: str | None = None) -> str:
    """`task`, or by the checkpoint's `architectures` "classification" (a sequence classifier) or "encoder". Refuses
    another head, labels without `architectures`, and "classification" of no sequence classifier."""
    if task is not None and task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}, got {task!r}")
    if task in ("encoder", "seq2seq"):
        return task
    architectures = config.architectures or []
    classifier = any(name.endswith("ForSequenceClassification") for name in architectures)
    others = [
        name for name in architectures if not name.endswith((*ENCODER_ARCHITECTURES, "ForSequenceClassification"))
    ]
    # a head is expected where asked for, or where labels were set (fine-tuned) but no architecture was recorded
    labelled = config.problem_type is not None or config.id2label != {0: "LABEL_0", 1: "LABEL_1"}
    if others or (task == "classification" or labelled and not architectures) and not classifier:
        raise ValueError(
            f"{name_or_path} has the architectures {architectures or 'none in its config'}; a fine-tuned "
            "*ForSequenceClassification converts with its head, a pretrained encoder (*Model, *ForMaskedLM, "
            "*ForPreTraining) without one (task='encoder' takes any checkpoint's encoder alone)"
        )
    return "classification" if classifier else "encoder"


@torch.no_grad()
def classifier_head(classifier: PreTrainedModel, bert: PreTrainedModel) -> ClassifierHead:
    """The head and labels of a fine-tuned `*ForSequenceClassification` whose encoder is `bert`, mapped exactly."""
    source = classifier.config
    pooler_type, dense, output = CLASSIFIER_HEADS[source.model_type]
    labels = {name: getattr(source, name) for name in LABEL_FIELDS}
    head = ClassifierHead(fastformer_config(bert.config, pooler_type=pooler_type, **labels))
    head.pooler.dense.load_state_dict(classifier.get_submodule(dense).state_dict())
    head.classifier.load_state_dict(classifier.get_submodule(output).state_dict())
    return head.to(classifier.dtype).eval()


def load_bert_source(name_or_path: str, task: str | None = None, **hub_kwargs) -> BertSource:
    """Load a BERT-family checkpoint (or a sentence-transformers model whose first module is one), a folder or a Hub
    id, for `task` (`source_task`); anything else raises a ValueError naming what is supported."""
    files = _sentence_transformers_files(name_or_path, **hub_kwargs)
    subfolder = ""
    if files:
        modules = json.loads(files["modules.json"])
        first = modules[0]
        if _module_class(first) != "Transformer":
            raise ValueError(
                f"{name_or_path} is a sentence-transformers model whose first module is {first['type']}; "
                "only a sentence-transformers Transformer module holding a BERT model can be converted"
            )
        others = [module["type"] for module in modules if _module_class(module) not in SENTENCE_TRANSFORMERS_SETTINGS]
        if others:
            raise ValueError(
                f"{name_or_path} is a sentence-transformers model with the modules {others}, which a converted "
                f"model cannot carry; the supported modules are {sorted(SENTENCE_TRANSFORMERS_SETTINGS)}"
            )
        subfolder = first.get("path", "")
    config = AutoConfig.from_pretrained(name_or_path, subfolder=subfolder, **hub_kwargs)
    if config.model_type not in SOURCE_MODELS:
        raise ValueError(
            f"{name_or_path} is a {config.model_type!r} model; only BERT-family checkpoints can be converted "
            f"(model_type one of {SUPPORTED_MODEL_TYPES}, e.g. google-bert/bert-base-uncased, FacebookAI/roberta-base "
            "or sentence-transformers/all-MiniLM-L6-v2)"
        )
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"{name_or_path} uses position_embedding_type={config.position_embedding_type!r}; Fastformer has "
            "learned absolute positions, so only 'absolute' converts"
        )
    task = source_task(config, name_or_path, task)
    if task == "classification":
        classifier = AutoModelForSequenceClassification.from_pretrained(name_or_path, subfolder=subfolder, **hub_kwargs)
        model = classifier.eval().base_model
    else:
        model_class = SOURCE_MODELS[config.model_type]
        pooler = {"add_pooling_layer": False} if model_class in (BertModel, RobertaModel, XLMRobertaModel) else {}
        model = model_class.from_pretrained(name_or_path, subfolder=subfolder, **pooler, **hub_kwargs).eval()
    if isinstance(model, DistilBertModel):
        model = bert_from_distilbert(model)
    head = classifier_head(classifier, model) if task == "classification" else None
    source = BertSource(
        name_or_path, model, config.model_type, subfolder=subfolder, sentence_transformers=files, task=task, head=head
    )
    if files:
        source.pooler_type = _sentence_transformers_pooler(name_or_path, files, modules)
    return source


def _sentence_transformers_pooler(name_or_path, files, modules) -> str:
    """The Fastformer pooler that computes the sentence-transformers Pooling module's vector."""
    pooling = [module for module in modules if _module_class(module) == "Pooling"]
    if not pooling:
        return "cls"
    folder = pooling[0].get("path", "")
    settings = json.loads(files.get(f"{folder}/config.json" if folder else "config.json", "{}"))
    if "pooling_mode" in settings:  # sentence-transformers 6: one mode by name
        modes = [settings["pooling_mode"]]
    else:  # one flag per mode
        flags = [flag for flag, value in settings.items() if flag.startswith("pooling_mode_") and value is True]
        modes = [flag.removeprefix("pooling_mode_") for flag in flags]
    if len(modes) != 1 or modes[0] not in SENTENCE_TRANSFORMERS_POOLING:
        raise ValueError(
            f"{name_or_path} pools with {modes}; a converted model pools with exactly one of "
            f"{sorted(SENTENCE_TRANSFORMERS_POOLING)}"
        )
    return SENTENCE_TRANSFORMERS_POOLING[modes[0]]


def sentence_transformers_files(source: BertSource, max_seq_length: int) -> dict[str, str]:
    """The source's sentence-transformers files (path -> text), the Transformer module at the root and its
    `max_seq_length` raised to `max_seq_length`."""
    modules = json.loads(source.sentence_transformers["modules.json"])
    files = {path: text for path, text in source.sentence_transformers.items() if path != "modules.json"}
    transformer_settings = f"{source.subfolder}/sentence_bert_config.json" if source.subfolder else None
    if transformer_settings in files:
        files["sentence_bert_config.json"] = files.pop(transformer_settings)
    modules[0]["path"] = ""
    files["modules.json"] = json.dumps(modules, indent=2) + "\n"
    if "sentence_bert_config.json" in files:
        settings = json.loads(files["sentence_bert_config.json"])
        settings["max_seq_length"] = max(settings.get("max_seq_length") or 0, max_seq_length)
        files["sentence_bert_config.json"] = json.dumps(settings, indent=2) + "\n"
    return files


def fastformer_config(
    bert_config,
    *,
    pooler_type: str = "cls",
    max_position_embeddings: int | None = None,
    task: str = "encoder",
    **overrides,
) -> FastformerConfig:
    """The Fastformer config of `bert_config`'s sizes: no sharing, the product interaction, no query residual; for
    `task="seq2seq"` a BERT tokenizer's special ids."""
    if task not in TASKS:
        raise ValueError(f"`task` must be one of {TASKS}, got {task!r}")
    readable = source_positions(bert_config)
    positions = max_position_embeddings or readable
    if positions < readable:
        raise ValueError(
            f"max_position_embeddings={positions} is below the source's {readable}; "
            "a converted model keeps every learned position"
        )
    settings = {name: getattr(bert_config, name) for name in SHARED_CONFIG_FIELDS}
    width = getattr(bert_config, "embedding_size", None) or bert_config.hidden_size
    settings["embedding_size"] = None if width == bert_config.hidden_size else width  # ELECTRA's, where narrower
    settings.update(max_position_embeddings=positions, pooler_type=pooler_type, interaction="product")
    settings.update(share_query_value=False, share_layers=False, share_heads=False, query_residual=False)
    if task == "seq2seq":  # bert-base-uncased's [CLS] starts, [SEP] ends a sequence; the script passes the tokenizer's
        settings.update(bos_token_id=101, decoder_start_token_id=101, eos_token_id=102)
    # an override of None keeps the source's value; the short convolution's or copy head's make a FastformerCopyConfig
    settings.update(overrides := {name: value for name, value in overrides.items() if value is not None})
    return (FastformerCopyConfig if COPY_FIELDS.keys() & overrides.keys() else FastformerConfig)(**settings)


def extend_positions(positions: torch.Tensor, length: int) -> torch.Tensor:
    """`length` position rows from the learned (P, hidden) ones: row i is row i mod P (as Longformer)."""
    index = torch.arange(length, device=positions.device) % positions.shape[0]
    return positions[index]


@torch.no_grad()
def copy_bert_weights(bert: PreTrainedModel, embeddings, layers) -> None:
    """Copy a BERT-family model's shared weights into Fastformer `embeddings` and encoder or decoder `layers`. Token
    type 0 is folded into the positions (any input embeds exactly as in BERT); what BERT lacks starts neutral: W_r
    the identity, w_q and w_k zero (both poolings plain means)."""
    if len(layers) != len(bert.encoder.layer):
        raise ValueError(f"{len(layers)} Fastformer layers cannot take the source's {len(bert.encoder.layer)}")
    source = bert.embeddings
    embeddings.word_embeddings.weight.copy_(source.word_embeddings.weight)
    segments = source.token_type_embeddings.weight
    positions = source.position_embeddings.weight[position_offset(bert.config) :] + segments[0]
    length = embeddings.position_embeddings.num_embeddings
    embeddings.position_embeddings.weight.copy_(extend_positions(positions, length))
    if embeddings.token_type_embeddings is not None:  # the encoder-decoder's decoder has none (as BART's)
        table = embeddings.token_type_embeddings.weight
        if len(segments) > len(table):
            raise ValueError(f"the source has {len(segments)} token types; Fastformer reads {len(table)}, as BERT")
        table.zero_()[: len(segments)].copy_(segments - segments[0])  # RoBERTa's one type: type 1 stays zero
    embeddings.layer_norm.load_state_dict(source.LayerNorm.state_dict())
    projection = getattr(bert, "embeddings_project", None)  # ELECTRA's, where its embeddings are narrower
    if (projection is None) != (embeddings.projection is None):
        raise ValueError("the source's embeddings and the Fastformer's differ in width: convert with fastformer_config")
    if projection is not None:
        embeddings.projection.load_state_dict(projection.state_dict())
    for bert_layer, layer in zip(bert.encoder.layer, layers):
        attention = layer.attention
        for name in ("query", "key", "value"):
            getattr(attention, name).load_state_dict(getattr(bert_layer.attention.self, name).state_dict())
        attention.transform.weight.copy_(torch.eye(attention.transform.in_features))
        attention.transform.bias.zero_()
        attention.query_weight.zero_()
        attention.key_weight.zero_()
        _copy_sublayer_output(bert_layer.attention.output, layer.attention_output)
        layer.feed_forward.intermediate.load_state_dict(bert_layer.intermediate.dense.state_dict())
        _copy_sublayer_output(bert_layer.output, layer.feed_forward.output)


@torch.no_grad()
def copy_bert_cross_attention(bert: PreTrainedModel, decoder_layers) -> None:
    """Each decoder layer's cross-attention from the same BERT layer's self-attention: its query, key (where it has
    one) and value projections, and its output sub-layer."""
    for bert_layer, layer in zip(bert.encoder.layer, decoder_layers, strict=True):
        for name in ("query", "key", "value"):
            if hasattr(layer.cross_attention, name):
                source = getattr(bert_layer.attention.self, name)
                getattr(layer.cross_attention, name).load_state_dict(source.state_dict())
        _copy_sublayer_output(bert_layer.attention.output, layer.cross_attention_output)


def _copy_sublayer_output(bert_output, output) -> None:
    output.dense.load_state_dict(bert_output.dense.state_dict())
    output.layer_norm.load_state_dict(bert_output.LayerNorm.state_dict())


def convert_bert(
    bert: PreTrainedModel,
    *,
    pooler_type: str = "cls",
    max_position_embeddings: int | None = None,
    task: str = "encoder",
    cross_attention_init: str = "random",
    head: ClassifierHead | None = None,
    **config_overrides,
) -> FastformerModel | FastformerForSequenceClassification | FastformerForConditionalGeneration:
    """A `FastformerModel` (`task="encoder"`), `FastformerForSequenceClassification` (`"classification"`, with the
    source's `head`) or `FastformerForConditionalGeneration` (`"seq2seq"`, both sides from `bert`, as BERT2BERT)
    holding `bert`'s weights; `cross_attention_init`: `CROSS_ATTENTION_INITS`. A classifier keeps the source's
    [CLS] attention in the last layer (`cls_attention_heads`: the source's heads unless overridden; 0: none)."""
    if cross_attention_init not in CROSS_ATTENTION_INITS:
        raise ValueError(f"cross_attention_init must be one of {CROSS_ATTENTION_INITS}, got {cross_attention_init!r}")
    if task != "seq2seq" and cross_attention_init != "random":
        raise ValueError(f'cross_attention_init={cross_attention_init!r} is for task="seq2seq": an encoder has none')
    if (task == "classification") != (head is not None):
        raise ValueError("task 'classification' takes the source's classifier `head` (load_bert_source's), only it")
    if head is not None:
        pooler_type = head.config.pooler_type
        config_overrides.update({name: getattr(head.config, name) for name in LABEL_FIELDS})
        if config_overrides.get("cls_attention_heads") is None:  # [CLS] keeps the source's last softmax attention
            config_overrides["cls_attention_heads"] = bert.config.num_attention_heads
    config = fastformer_config(
        bert.config,
        pooler_type=pooler_type,
        max_position_embeddings=max_position_embeddings,
        task=task,
        **config_overrides,
    )
    if task != "seq2seq":
        model = FastformerModel(config) if head is None else FastformerForSequenceClassification(config)
        copy_bert_weights(bert, model.base_model.embeddings, model.base_model.layers)
        if head is not None:
            model.base_model.pooler.load_state_dict(head.pooler.state_dict())
            model.classifier.load_state_dict(head.classifier.state_dict())
    else:
        model = FastformerForConditionalGeneration(config)
        encoder, decoder = model.get_encoder(), model.get_decoder()
        copy_bert_weights(bert, encoder.embeddings, encoder.layers)
        copy_bert_weights(bert, decoder.embeddings, decoder.layers)
        if cross_attention_init == "self_attention":
            copy_bert_cross_attention(bert, decoder.layers)
    return model.to(bert.dtype).eval()


def copy_encoder_layers(encoder: FastformerModel, decoder_layers) -> None:
    """The decoder layers' self-attention and feed-forward take the encoder layers' weights; the rest stays."""
    with torch.no_grad():
        for layer, decoder_layer in zip(encoder.layers, decoder_layers):
            for name in ("attention", "attention_output", "feed_forward"):
                source = getattr(layer, name).state_dict()
                keys = getattr(decoder_layer, name).load_state_dict(source, strict=False)
                if set(keys.missing_keys) - {"convolution.weight"} or keys.unexpected_keys:
                    raise ValueError(f"The decoder's {name} and the encoder's do not match: {keys}")


__all__ = [
    "CROSS_ATTENTION_INITS",
    "SUPPORTED_MODEL_TYPES",
    "TASKS",
    "BertSource",
    "CLASSIFIER_HEADS",
    "ClassifierHead",
    "SOURCE_MODELS",
    "bert_from_distilbert",
    "classifier_head",
    "convert_bert",
    "copy_bert_cross_attention",
    "copy_bert_weights",
    "copy_encoder_layers",
    "extend_positions",
    "fastformer_config",
    "load_bert_source",
    "position_offset",
    "sentence_transformers_files",
    "source_positions",
    "source_task",
]
