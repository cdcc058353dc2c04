"""FastformerConfig: the paper's defaults, validation with clear errors, round trip, Hub code at saving."""

import json

import pytest
import transformers
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import AutoConfig

from fastformer import (
    FastformerConfig,
    FastformerCopyConfig,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)
from fastformer.configuration_fastformer import COPY_FIELDS

# @strict's errors: a field's own rule (at construction and assignment), and a class validator's (fields that must
# fit together, at the end of construction, by validate() and when saving)
FIELD = StrictDataclassFieldValidationError
CLASS = StrictDataclassClassValidationError
# what a saved checkpoint's `auto_map` holds, whichever head saved it: the config and every head, as Hub code
HUB_CODE = {
    "AutoConfig": "configuration_fastformer.FastformerConfig",
    "AutoModel": "modeling_fastformer.FastformerModel",
    "AutoModelForSequenceClassification": "modeling_fastformer.FastformerForSequenceClassification",
    "AutoModelForMaskedLM": "modeling_fastformer.FastformerForMaskedLM",
    "AutoModelForSeq2SeqLM": "modeling_fastformer.FastformerForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_fastformer.FastformerForCausalLM",
}
SUMMARIZATION = {
    "impl": "pipeline_fastformer.SummarizationPipeline",
    "pt": ["AutoModelForSeq2SeqLM"],
    "type": "text",
}


def test_defaults_are_the_papers_final_model():
    config = FastformerConfig()
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (256, 16, 2)
    assert config.hidden_dropout_prob == 0.2
    assert config.interaction == "product"
    assert config.share_query_value and config.share_layers and not config.share_heads
    assert config.pooler_type == "additive"
    assert config.tie_word_embeddings
    assert config.num_decoder_layers == config.num_hidden_layers  # as T5: the decoder mirrors the encoder
    assert config.cross_attention_type == "softmax"


@pytest.mark.parametrize(
    "overrides, error, message",
    [
        (
            {"interaction": "dot"},
            FIELD,
            r"field 'interaction':\n.*TypeError: .* expected one of \('product', 'add', 'concat'\), got dot$",
        ),
        (
            {"pooler_type": "max"},
            FIELD,
            r"field 'pooler_type':\n.* expected one of "
            r"\('additive', 'cls', 'mean', 'cls_tanh', 'cls_relu', 'cls_gelu'\), got max$",
        ),
        (
            {"hidden_act": "swish-ish"},
            FIELD,
            r"field 'hidden_act':\n.* must be one of \(.*'gelu'.*\), got 'swish-ish'$",
        ),
        ({"hidden_size": 0}, FIELD, r"field 'hidden_size':\n    ValueError: must be a positive integer, got 0$"),
        ({"num_hidden_layers": 0}, FIELD, r"field 'num_hidden_layers':\n.* must be a positive integer, got 0$"),
        ({"vocab_size": 10.5}, FIELD, r"field 'vocab_size':\n.* expected int, got float \(value: 10.5\)$"),
        (
            {"hidden_dropout_prob": 1.5},
            FIELD,
            r"field 'hidden_dropout_prob':\n.* must be a number in \[0, 1\), got 1.5$",
        ),
        ({"layer_norm_eps": 0}, FIELD, r"field 'layer_norm_eps':\n.* must be a positive number, got 0$"),
        ({"share_layers": "yes"}, FIELD, r"field 'share_layers':\n.* expected bool, got str \(value: 'yes'\)$"),
        ({"share_query_value": 1}, FIELD, r"field 'share_query_value':\n.* expected bool, got int \(value: 1\)$"),
        ({"cross_attention_type": "linear"}, FIELD, r"field 'cross_attention_type':\n.* \('softmax', 'additive'\)"),
        ({"num_decoder_layers": 0}, FIELD, r"field 'num_decoder_layers':\n.* must be a positive integer, got 0$"),
        (
            {"decoder_conv_kernel": 1},
            FIELD,
            r"field 'decoder_conv_kernel':\n.* must be 0 \(none\) or a kernel of at least 2 tokens, got 1$",
        ),
        ({"use_cache": None}, FIELD, r"field 'use_cache':\n.* expected bool, got NoneType \(value: None\)$"),
        (
            {"hidden_size": 30, "num_attention_heads": 4},
            CLASS,
            r"validator 'validate_architecture':\n    ValueError: `hidden_size` \(30\) must be divisible by .* \(4\)$",
        ),
        (
            {"chunk_size_feed_forward": -1},
            CLASS,
            r"'validate_architecture':\n.* `chunk_size_feed_forward` must be 0 \(no chunks\) or more, got -1$",
        ),
        (
            {"vocab_size": 10, "pad_token_id": 10},
            CLASS,
            r"'validate_token_ids':\n.* `pad_token_id` must be None or an id in \[0, 10\), got 10$",
        ),
        (
            {"vocab_size": 10, "decoder_start_token_id": -1},
            CLASS,
            r"'validate_token_ids':\n.* `decoder_start_token_id` must be None or an id in \[0, 10\), got -1$",
        ),
        (
            {"vocab_size": 10, "eos_token_id": [2, 10]},
            CLASS,
            r"'validate_token_ids':\n.* `eos_token_id` must be .* list of ids in \[0, 10\), got \[2, 10\]$",
        ),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else None,
)
def test_invalid_values_raise_strict_errors_naming_the_field_the_rule_and_the_value(overrides, error, message):
    config_class = FastformerCopyConfig if COPY_FIELDS.keys() & overrides.keys() else FastformerConfig
    with pytest.raises(error, match=message):
        config_class(**overrides)


def test_round_trip_keeps_every_switch(tmp_path):
    config = FastformerConfig(
        hidden_size=64,
        num_attention_heads=4,
        share_query_value=False,
        share_layers=False,
        share_heads=True,
        interaction="concat",
        pooler_type="mean",
        num_labels=5,
    )
    config.save_pretrained(tmp_path)
    loaded = FastformerConfig.from_pretrained(tmp_path)
    assert loaded.to_dict() == config.to_dict()
    assert (tmp_path / "configuration_fastformer.py").exists()  # Hub code for trust_remote_code


def test_errors_are_raised_at_assignment_and_saving(tmp_path):
    config = FastformerConfig()
    with pytest.raises(FIELD, match=r"field 'hidden_size':\n    ValueError: must be a positive integer, got -1$"):
        config.hidden_size = -1
    with pytest.raises(FIELD, match=r"field 'interaction':\n.* expected one of .*, got mul$"):
        config.interaction = "mul"
    assert (config.hidden_size, config.interaction) == (256, "product")  # a refused value is not set
    config.num_attention_heads = 5  # only the field's own rule runs on assignment; validate() checks the rest
    with pytest.raises(CLASS, match=r"`hidden_size` \(256\) must be divisible by `num_attention_heads` \(5\)"):
        config.validate()
    config.num_attention_heads = 15
    with pytest.raises(CLASS, match=r"`hidden_size` \(256\) must be divisible by `num_attention_heads` \(15\)"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()
    config.num_attention_heads = 16
    with pytest.raises(CLASS, match=r"`hidden_size` \(256\) must be divisible by `cls_attention_heads` \(6\)"):
        config.cls_attention_heads = 6
        config.validate()
    with pytest.raises(FIELD, match=r"field 'cls_attention_heads':\n.* must be 0 \(none\) or a positive integer"):
        config.cls_attention_heads = -1


def test_the_generation_model_leaves_the_config_it_is_given_unchanged():
    config = FastformerConfig(hidden_size=32, num_attention_heads=4)
    before = config.to_dict()
    model = FastformerForConditionalGeneration(config)
    assert config.to_dict() == before and not config.is_encoder_decoder
    assert model.config.is_encoder_decoder
    seq2seq = FastformerConfig(hidden_size=32, num_attention_heads=4, is_encoder_decoder=True)
    assert FastformerForConditionalGeneration(seq2seq).config is seq2seq  # nothing to change: the same object


def test_building_a_config_declares_no_hub_code():
    """`auto_map` and `custom_pipelines` are written when a checkpoint is saved, not when a config is built."""
    encoder = FastformerConfig()
    seq2seq = FastformerConfig(is_encoder_decoder=True)
    built = [encoder, seq2seq, encoder.for_encoder_decoder(), FastformerForConditionalGeneration(encoder).config]
    for config in built:
        for name in ("auto_map", "custom_pipelines"):
            assert not hasattr(config, name) and name not in config.to_dict()


@pytest.mark.parametrize(
    "model_class",
    [
        FastformerModel,
        FastformerForSequenceClassification,
        FastformerForMaskedLM,
        FastformerForConditionalGeneration,
        FastformerForCausalLM,
    ],
    ids=lambda model_class: model_class.__name__,
)
def test_saving_any_head_writes_the_hub_code_of_every_head(model_class, tiny_config, tmp_path, repo_root):
    model_class(tiny_config()).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"] == HUB_CODE
    for auto_class, path in HUB_CODE.items():  # each as `import fastformer` registers it
        if auto_class != "AutoConfig":
            registered = getattr(transformers, auto_class)._model_mapping[FastformerConfig]
            assert registered.__name__ == path.partition(".")[2]
    seq2seq = model_class is FastformerForConditionalGeneration
    assert saved.get("custom_pipelines") == ({"summarization": SUMMARIZATION} if seq2seq else None)
    modules = ["configuration_fastformer.py", "modeling_fastformer.py", "functional.py", "pipeline_fastformer.py"]
    for module in modules:
        assert (tmp_path / module).read_text() == (repo_root / "fastformer" / module).read_text()
    assert FastformerConfig.from_pretrained(tmp_path).auto_map == HUB_CODE  # a loaded config keeps it


def test_a_saved_encoder_decoder_config_ships_its_pipeline(tmp_path, repo_root):
    """Saved alone (without a model's code), the config declares the pipeline and copies its file."""
    FastformerConfig().for_encoder_decoder().save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"] == HUB_CODE and saved["custom_pipelines"] == {"summarization": SUMMARIZATION}
    pipeline_file = "pipeline_fastformer.py"
    assert (tmp_path / pipeline_file).read_text() == (repo_root / "fastformer" / pipeline_file).read_text()


def test_saving_keeps_the_configs_own_hub_code_entries(tmp_path):
    own_map = {"AutoTokenizer": ["tokenization_mine.MyTokenizer", None], "AutoModel": "modeling_mine.MyModel"}
    own_pipeline = {"impl": "pipeline_mine.MyPipeline", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
    config = FastformerConfig(is_encoder_decoder=True, auto_map=own_map, custom_pipelines={"mine": own_pipeline})
    config.save_pretrained(tmp_path / "first")
    loaded = FastformerConfig.from_pretrained(tmp_path / "first")
    assert loaded.auto_map == {**HUB_CODE, **own_map}
    assert loaded.custom_pipelines == {"summarization": SUMMARIZATION, "mine": own_pipeline}
    loaded.save_pretrained(tmp_path / "again")  # saved again: the same
    saved = json.loads((tmp_path / "again" / "config.json").read_text())
    assert saved["auto_map"] == {**HUB_CODE, **own_map}
    assert saved["custom_pipelines"] == {"summarization": SUMMARIZATION, "mine": own_pipeline}


def test_a_config_class_not_registered_for_hub_code_saves_none(monkeypatch, tmp_path):
    monkeypatch.setattr(FastformerConfig, "_auto_class", None)
    FastformerConfig(is_encoder_decoder=True).save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "auto_map" not in saved and "custom_pipelines" not in saved
    assert not list(tmp_path.glob("*.py"))


def test_eos_token_id_takes_a_list_of_ids(tmp_path):
    config = FastformerConfig(vocab_size=10, eos_token_id=[2, 9])
    config.save_pretrained(tmp_path)
    assert FastformerConfig.from_pretrained(tmp_path).eos_token_id == [2, 9]


def test_transformers_own_settings_pass_through(tmp_path):
    assert FastformerConfig(num_labels=3).num_labels == 3
    config = FastformerConfig(
        id2label={0: "negative", 1: "positive"}, problem_type="single_label_classification", is_encoder_decoder=True
    )
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, FastformerConfig)
    assert loaded.id2label == {0: "negative", 1: "positive"}
    assert loaded.num_labels == 2 and loaded.problem_type == "single_label_classification"
    assert loaded.is_encoder_decoder


def test_embedding_width_follows_the_hidden_size_unless_set():
    """`embedding_size=None` means the hidden size as it is when a model is built (`--config_overrides` changes it
    after init); a set width gets a projection, which the generative models refuse."""
    config = FastformerConfig(hidden_size=64, num_attention_heads=4)
    config.hidden_size = 32  # as --config_overrides hidden_size=32 does
    model = FastformerForConditionalGeneration(config)
    assert config.embedding_size is None and model.get_input_embeddings().weight.shape[1] == 32
    assert model.get_encoder().embeddings.projection is None
    narrow = FastformerConfig(hidden_size=32, num_attention_heads=4, embedding_size=16)
    assert FastformerModel(narrow).embeddings.projection.in_features == 16
    with pytest.raises(ValueError, match="needs embedding_size == hidden_size"):
        FastformerForConditionalGeneration(narrow)


def test_fields_of_earlier_releases_are_dropped_with_a_warning_or_load_as_the_copy_config(caplog):
    """A saved config's retired fields: those that changed no output are dropped with a warning naming them; the
    copy head's and the short convolution's load as `FastformerCopyConfig`, which holds them now."""
    saved = {"model_type": "fastformer", "classifier_dropout": 0.3, "additive_attention_mode": "plain"}
    saved |= {"copy_mechanism": False, "decoder_conv_kernel": 0, "tie_encoder_embeddings": True}
    with caplog.at_level("WARNING"):
        config = FastformerConfig.from_dict(dict(saved))
    assert type(config) is FastformerConfig and not hasattr(config, "classifier_dropout")
    assert "`classifier_dropout` (now hidden_dropout_prob)" in caplog.text and "`decoder_conv_kernel`" in caplog.text
    copy = AutoConfig.for_model("fastformer").from_dict({**saved, "copy_mechanism": True, "copy_spans": True})
    assert type(copy) is FastformerCopyConfig and copy.copy_spans and copy.model_type == "fastformer_copy"
    assert type(FastformerConfig.from_dict({**saved, "decoder_conv_kernel": 3})) is FastformerCopyConfig
    with pytest.raises(ValueError, match="`decoder_conv_kernel` is a field of FastformerCopyConfig"):
        FastformerConfig(decoder_conv_kernel=3)
