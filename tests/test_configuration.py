"""FastformerConfig: the paper's defaults, validation with clear errors, round trip."""

import json

import pytest
from huggingface_hub.errors import StrictDataclassClassValidationError, StrictDataclassFieldValidationError
from transformers import AutoConfig

from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerModel, modeling_fastformer


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
    assert config.additive_attention_mode == "auto"


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"interaction": "dot"}, r"`interaction` must be one of \('product', 'add', 'concat'\), got 'dot'"),
        ({"pooler_type": "max"}, r"`pooler_type` must be one of \('additive', 'cls', 'mean'\), got 'max'"),
        ({"hidden_act": "swish-ish"}, r"`hidden_act` must be one of \(.*'gelu'.*\), got 'swish-ish'"),
        ({"hidden_size": 30, "num_attention_heads": 4}, r"`hidden_size` \(30\) must be divisible by .* \(4\)"),
        ({"num_hidden_layers": 0}, r"`num_hidden_layers` must be a positive integer, got 0"),
        ({"vocab_size": 10.5}, r"`vocab_size` must be a positive integer, got 10.5"),
        ({"hidden_dropout_prob": 1.5}, r"`hidden_dropout_prob` must be a number in \[0, 1\), got 1.5"),
        ({"classifier_dropout": -0.1}, r"`classifier_dropout` must be a number in \[0, 1\), got -0.1"),
        ({"layer_norm_eps": 0}, r"`layer_norm_eps` must be a positive number, got 0"),
        ({"share_layers": "yes"}, r"`share_layers` must be one of \(True, False\), got 'yes'"),
        ({"share_query_value": 1}, r"`share_query_value` must be one of \(True, False\), got 1"),
        ({"vocab_size": 10, "pad_token_id": 10}, r"`pad_token_id` must be None or an id in \[0, 10\), got 10"),
        ({"vocab_size": 10, "decoder_start_token_id": -1}, r"`decoder_start_token_id` must be None or an id in"),
        ({"cross_attention_type": "linear"}, r"`cross_attention_type` must be one of \('softmax', 'additive'\)"),
        ({"num_decoder_layers": 0}, r"`num_decoder_layers` must be a positive integer, got 0"),
        ({"use_cache": None}, r"`use_cache` must be one of \(True, False\), got None"),
        (
            {"vocab_size": 10, "eos_token_id": [2, 10]},
            r"`eos_token_id` must be .* list of ids in \[0, 10\), got \[2, 10\]",
        ),
        (
            {"additive_attention_mode": "fast"},
            r"`additive_attention_mode` must be one of \('auto', 'plain', 'collapsed'\), got 'fast'",
        ),
        (
            {"interaction": "add", "additive_attention_mode": "collapsed"},
            r'`additive_attention_mode="collapsed"` .* needs `interaction="product"`, got interaction=\'add\'; use',
        ),
    ],
    ids=lambda value: "-".join(value) if isinstance(value, dict) else None,
)
def test_invalid_values_raise_value_error_naming_the_allowed_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        FastformerConfig(**overrides)


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


def test_errors_are_also_the_strict_dataclass_errors_and_are_raised_at_assignment_and_saving(tmp_path):
    with pytest.raises(StrictDataclassFieldValidationError, match="`interaction` must be one of"):
        FastformerConfig(interaction="mul")
    config = FastformerConfig()
    with pytest.raises(ValueError, match=r"`interaction` must be one of .*, got 'mul'"):
        config.interaction = "mul"
    config.interaction = "add"
    config.additive_attention_mode = "collapsed"
    with pytest.raises(ValueError, match='needs `interaction="product"`') as refusal:
        config.save_pretrained(tmp_path)
    assert isinstance(refusal.value, StrictDataclassClassValidationError)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize(
    "additive_attention_mode, interaction",
    [("auto", "product"), ("plain", "product"), ("collapsed", "product"), ("auto", "add"), ("plain", "concat")],
    ids=lambda value: value,
)
def test_additive_attention_mode_values_round_trip(additive_attention_mode, interaction, tmp_path):
    config = FastformerConfig(additive_attention_mode=additive_attention_mode, interaction=interaction)
    config.save_pretrained(tmp_path)
    loaded = FastformerConfig.from_pretrained(tmp_path)
    assert (loaded.additive_attention_mode, loaded.interaction) == (additive_attention_mode, interaction)


def test_config_saved_before_additive_attention_mode_loads_as_auto(tmp_path):
    FastformerConfig(additive_attention_mode="plain").save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    del saved["additive_attention_mode"]
    path.write_text(json.dumps(saved))
    assert FastformerConfig.from_pretrained(tmp_path).additive_attention_mode == "auto"
    assert AutoConfig.from_pretrained(tmp_path).additive_attention_mode == "auto"


@pytest.mark.parametrize("mode", ["plain", "collapsed"])
def test_config_saved_with_the_former_name_attention_implementation_keeps_its_value(mode, tmp_path):
    FastformerConfig().save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    saved = json.loads(path.read_text())
    del saved["additive_attention_mode"]
    path.write_text(json.dumps({**saved, "attention_implementation": mode}))
    for loader in (FastformerConfig, AutoConfig):
        loaded = loader.from_pretrained(tmp_path)
        assert loaded.additive_attention_mode == mode and not hasattr(loaded, "attention_implementation")
    assert "attention_implementation" not in loaded.to_dict()  # saved again under the one name


def test_the_generation_model_leaves_the_config_it_is_given_unchanged():
    config = FastformerConfig(hidden_size=32, num_attention_heads=4)
    before = config.to_dict()
    model = FastformerForConditionalGeneration(config)
    assert config.to_dict() == before and not config.is_encoder_decoder
    assert model.config.is_encoder_decoder and "summarization" in model.config.custom_pipelines
    seq2seq = FastformerConfig(hidden_size=32, num_attention_heads=4, is_encoder_decoder=True)
    assert FastformerForConditionalGeneration(seq2seq).config is seq2seq  # nothing to change: the same object


def test_auto_map_names_every_head_for_hub_code():
    config = FastformerConfig()
    assert config.auto_map["AutoConfig"] == "configuration_fastformer.FastformerConfig"
    assert config.auto_map["AutoModelForCausalLM"] == "modeling_fastformer.FastformerForCausalLM"
    assert set(config.auto_map) == {"AutoConfig", *modeling_fastformer.AUTO_CLASSES.values()}
    for model_class, auto_class in modeling_fastformer.AUTO_CLASSES.items():
        assert config.auto_map[auto_class] == f"modeling_fastformer.{model_class.__name__}"
    assert not hasattr(config, "custom_pipelines")  # an encoder's config has no summarization pipeline


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
    assert model.fastformer.embeddings.projection is None
    narrow = FastformerConfig(hidden_size=32, num_attention_heads=4, embedding_size=16)
    assert FastformerModel(narrow).embeddings.projection.in_features == 16
    with pytest.raises(ValueError, match="needs embedding_size == hidden_size"):
        FastformerForConditionalGeneration(narrow)
