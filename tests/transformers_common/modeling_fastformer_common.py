"""transformers' own common model tests (`ModelTesterMixin`) on Fastformer's encoder heads and its encoder-decoder.

Not part of this suite: `run.sh` beside this file copies it into the source distribution of the installed
transformers as `tests/models/fastformer/test_modeling_fastformer.py` and runs it there, as transformers runs its
own models' tests. What is skipped, and why, is written at each skip.
"""

import unittest

from transformers.models.auto import modeling_auto

from fastformer import (
    FastformerConfig,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)

from ...test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask

# A model inside transformers is named in these tables; the mixin reads them to give each head its labels and to
# leave the bare model out of the training tests (`register()` fills the Auto classes, not these tables)
for _table, _model_class in [
    (modeling_auto.MODEL_MAPPING_NAMES, FastformerModel),
    (modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES, FastformerForSequenceClassification),
    (modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES, FastformerForMaskedLM),
    (modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, FastformerForConditionalGeneration),
]:
    _table.setdefault(FastformerConfig.model_type, _model_class.__name__)


class FastformerModelTester:
    def __init__(self, parent, is_encoder_decoder=False, batch_size=13, seq_length=7):
        self.parent = parent
        self.is_encoder_decoder = is_encoder_decoder
        # the mixin gives a seq2seq model labels of seq_length tokens: the decoder input has as many
        self.batch_size, self.seq_length, self.decoder_seq_length = batch_size, seq_length, seq_length
        self.encoder_seq_length = seq_length
        self.is_training = True
        self.vocab_size = 99
        self.hidden_size = 32
        self.num_hidden_layers = 2
        self.num_attention_heads = 4
        self.num_labels = 3

    def get_config(self):
        return FastformerConfig(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=37,
            max_position_embeddings=64,
            hidden_dropout_prob=0.1,
            num_labels=self.num_labels,
            pad_token_id=0,
            bos_token_id=1,
            decoder_start_token_id=1,
            eos_token_id=2,
            share_layers=False,
            is_encoder_decoder=self.is_encoder_decoder,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        inputs = {"input_ids": input_ids, "attention_mask": random_attention_mask([self.batch_size, self.seq_length])}
        if self.is_encoder_decoder:
            inputs["decoder_input_ids"] = ids_tensor([self.batch_size, self.decoder_seq_length], self.vocab_size)
        return self.get_config(), inputs


class FastformerCommonTests:
    """What both testers share: the skips, each with its reason."""

    def setUp(self):
        self.model_tester = FastformerModelTester(self, is_encoder_decoder=self.is_encoder_decoder)

    @unittest.skip(
        "Fastformer's `attentions` are its additive attention's two pooling distributions per layer, (batch, heads, "
        "2, seq_len) in the encoder and (batch, heads, 2, seq_len, seq_len) in the decoder, not one (seq_len x "
        "seq_len) map per head: the project's tests/test_modeling.py and tests/test_generation.py check them"
    )
    def test_attention_outputs(self):
        pass

    @unittest.skip(
        "the returned `attentions` stack the two pooling distributions into a new tensor, which the output does not "
        "depend on, so it gets no gradient (the distributions themselves do)"
    )
    def test_retain_grad_hidden_states_attentions(self):
        pass


class FastformerModelTest(FastformerCommonTests, ModelTesterMixin, unittest.TestCase):
    all_model_classes = (FastformerModel, FastformerForSequenceClassification, FastformerForMaskedLM)
    is_encoder_decoder = False


class FastformerForConditionalGenerationTest(FastformerCommonTests, ModelTesterMixin, unittest.TestCase):
    all_model_classes = (FastformerForConditionalGeneration,)
    is_encoder_decoder = True
    # no generate() tests: transformers' GenerationTesterMixin (tests/generation/) is not in its source
    # distribution; the project's suite tests generation against GPT-2's and BART's
    all_generative_model_classes = ()
