"""transformers' `EncoderDecoderModel` with Fastformer's copy head: the BERT2BERT baseline given the same
pointer-generator as `FastformerCopyForConditionalGeneration`, so that the lever is tried
on both (`conversion.bert2bert_model(..., copy_mechanism=True)` builds one).

`import fastformer` registers it with transformers' Auto classes (model type "copy-encoder-decoder"), so that
`AutoModelForSeq2SeqLM.from_pretrained` and the training scripts load a saved one."""

import torch
from transformers import EncoderDecoderConfig, EncoderDecoderModel
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.models.encoder_decoder.modeling_encoder_decoder import shift_tokens_right

from .copy_head import CopyHeadMixin, FastformerCopyHead


class CopyEncoderDecoderConfig(EncoderDecoderConfig):
    """An `EncoderDecoderConfig` under a model type of its own, so that Auto classes load the model with its head."""

    model_type = "copy-encoder-decoder"


class CopyEncoderDecoderModel(CopyHeadMixin, EncoderDecoderModel):
    """An `EncoderDecoderModel` whose output distribution is the pointer-generator's (`FastformerCopyHead` on the
    decoder's last hidden state and the encoder's output): log-probabilities as `logits`, the loss their NLL (as
    Fastformer's). `source_ids` default to `input_ids`; generate() keeps them for every step and beam."""

    config_class = CopyEncoderDecoderConfig

    def __init__(self, config=None, encoder=None, decoder=None):
        if config is None and encoder is not None and decoder is not None:
            config = CopyEncoderDecoderConfig.from_encoder_decoder_configs(encoder.config, decoder.config)
        super().__init__(config, encoder, decoder)
        self.copy_head = FastformerCopyHead(self.config.decoder)
        for module in self.copy_head.modules():
            self._init_weights(module)

    def _init_weights(self, module):
        """As `CopyHeadMixin`'s, and the copy head's other modules as the decoder's: at construction, and for
        weights a loaded checkpoint lacks."""
        if getattr(self, "copy_head", None) is not None and module in self.copy_head.modules():
            if hasattr(module, "init_weights"):
                module.init_weights()
            else:
                self.decoder._init_weights(module)
        else:
            super()._init_weights(module)

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        labels: torch.Tensor | None = None,
        source_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        if isinstance(encoder_outputs, (tuple, list)):
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        if labels is not None and decoder_input_ids is None and kwargs.get("decoder_inputs_embeds") is None:
            decoder_input_ids = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
            if kwargs.get("decoder_attention_mask") is None:
                kwargs["decoder_attention_mask"] = (decoder_input_ids != self.config.pad_token_id).to(labels.dtype)
        self.copy_head.check_decoder_input_ids(decoder_input_ids)
        # the head reads the decoder's last hidden state; the encoder's states only where asked for
        hidden_states_asked = kwargs.pop("output_hidden_states", False)
        kwargs["return_dict"] = True
        outputs = super().forward(
            input_ids=input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_output_hidden_states=True,
            **({"output_hidden_states": True} if hidden_states_asked else {}),
            **kwargs,
        )
        encoder_states = outputs.encoder_last_hidden_state
        if source_ids is None:
            source_ids = input_ids
        source_ids = self.checked_source_ids(source_ids, encoder_states)
        hidden_states = outputs.decoder_hidden_states[-1]
        outputs.logits, _ = self.copy_head(
            hidden_states, outputs.logits, encoder_states, attention_mask, source_ids, decoder_input_ids
        )
        if labels is not None:
            vocab_size = self.config.decoder.vocab_size
            outputs.loss = ForMaskedLMLoss(outputs.logits, labels, vocab_size, num_items_in_batch=num_items_in_batch)
        if not hidden_states_asked:
            outputs.decoder_hidden_states = None
        return outputs
