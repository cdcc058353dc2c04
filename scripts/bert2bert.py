"""The summarization recipe's softmax baseline, Rothe et al.'s BERT2BERT (`bert2bert_model`), and transformers'
`EncoderDecoderModel` with Fastformer's copy head (`CopyEncoderDecoderModel`), so that the copy head is tried on
both families. Importing this module registers the latter with transformers' Auto classes (model type
"copy-encoder-decoder"), so that `AutoModelForSeq2SeqLM.from_pretrained` and run_summarization.py load a saved one."""

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, EncoderDecoderConfig, EncoderDecoderModel
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.models.encoder_decoder.modeling_encoder_decoder import shift_tokens_right

from fastformer.configuration_fastformer import check_copy_context_window
from fastformer.conversion import CROSS_ATTENTION_INITS
from fastformer.copy_head import CopyHeadMixin, FastformerCopyHead


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
        source_ids = source_ids if source_ids is not None else input_ids
        outputs.logits, _, loss = self.copy_logits(
            outputs,
            outputs.decoder_hidden_states[-1],
            source_ids,
            attention_mask,
            decoder_input_ids,
            labels,
            num_items_in_batch=num_items_in_batch,
        )
        outputs.loss = loss
        if not hidden_states_asked:
            outputs.decoder_hidden_states = None
        return outputs


def bert2bert_model(
    source: str,
    cross_attention_init: str = "random",
    copy_mechanism: bool = False,
    copy_spans: bool = False,
    copy_context_window: int = 0,
    **kwargs,
) -> tuple:
    """(model, tokenizer): the softmax baseline of a converted encoder-decoder, Rothe et al.'s BERT2BERT
    (arXiv:1907.12461), an EncoderDecoderModel of two `source` BERTs (`kwargs` to both configs), special tokens from
    the source's tokenizer. "self_attention": each decoder layer's cross-attention starts as its self-attention.
    `copy_mechanism`: a `CopyEncoderDecoderModel` (`copy_spans`, `copy_context_window` as `FastformerCopyConfig`'s, set
    on the decoder's config)."""
    if cross_attention_init not in CROSS_ATTENTION_INITS:
        raise ValueError(f"cross_attention_init must be one of {CROSS_ATTENTION_INITS}, got {cross_attention_init!r}")
    if copy_spans and not copy_mechanism:
        raise ValueError("`copy_spans` continues the copy head's spans and needs `copy_mechanism=True`")
    if copy_context_window and not copy_mechanism:
        raise ValueError("`copy_context_window` widens the copy head's source states and needs `copy_mechanism=True`")
    check_copy_context_window(copy_context_window)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = EncoderDecoderModel.from_encoder_decoder_pretrained(source, source, **kwargs)
    if copy_mechanism:
        model.decoder.config.copy_spans = copy_spans
        model.decoder.config.copy_context_window = copy_context_window
        model = CopyEncoderDecoderModel(encoder=model.encoder, decoder=model.decoder)
    special = {"decoder_start_token_id": tokenizer.cls_token_id, "bos_token_id": tokenizer.cls_token_id}
    special |= {"eos_token_id": tokenizer.sep_token_id, "pad_token_id": tokenizer.pad_token_id}
    model.config.update(special)
    model.generation_config.update(**special)
    if cross_attention_init == "self_attention":
        for layer in model.decoder.bert.encoder.layer:
            layer.crossattention.load_state_dict(layer.attention.state_dict())
    return model, tokenizer


AutoConfig.register(CopyEncoderDecoderConfig.model_type, CopyEncoderDecoderConfig, exist_ok=True)
AutoModelForSeq2SeqLM.register(CopyEncoderDecoderConfig, CopyEncoderDecoderModel, exist_ok=True)
