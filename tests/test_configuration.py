"""FastformerConfig: the paper's defaults, validation with clear errors, round trip."""

import pytest

from fastformer import FastformerConfig


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
