"""See et al.'s pointer-generator (2017): the copy head, the source ids a model with one keeps for every decoding step,
and `FastformerCopyForConditionalGeneration`, Fastformer's encoder-decoder with it."""

from dataclasses import dataclass

import torch
from torch import nn
from transformers import initialization as init
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, register_checkpoint_conversion_mapping
from transformers.loss.loss_utils import ForMaskedLMLoss
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.modeling_utils import slice_logits_to_keep
from transformers.utils.generic import can_return_tuple

from .checks import check_inputs, checked_token_labels
from .configuration_fastformer import FastformerConfig, FastformerCopyConfig, check_copy_context_window
from .functional import accumulation_dtype, copy_attention, pointer_generator, source_context, span_continuations
from .modeling_fastformer import FastformerForCausalLM, FastformerForConditionalGeneration


class SpanGate(nn.Linear):
    """The copy head's span gate g_t = u . h_t + c (`copy_spans`), starting at u = 0 and c = 4: a span's
    continuation starts e^4 (about 55) times as likely to be copied as another source token."""

    initial_bias = 4.0

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 1)

    def init_weights(self):
        """The initial weights, for the model's `_init_weights`."""
        init.zeros_(self.weight)
        init.constant_(self.bias, self.initial_bias)


class SourceContext(nn.Module):
    """The copy head's source states with their neighbours (`copy_context_window`, `functional.source_context`)."""

    def __init__(self, hidden_size: int, window: int):
        super().__init__()
        check_copy_context_window(window)
        self.weight = nn.Parameter(torch.zeros(hidden_size, 1, window))

    def init_weights(self):
        """The initial weights, for the model's `_init_weights`."""
        init.zeros_(self.weight)

    def forward(self, source, source_mask=None):  # (B, M, D), (B, M)
        return source_context(source, self.weight, source_mask)


class FastformerCopyHead(nn.Module):
    """The pointer-generator of See et al. (2017): each decoder output h_t attends over the encoder output
    (`functional.copy_attention`, query W h_t), and a gate p_gen = sigmoid(w . [h_t ; context_t] + b) mixes the LM
    head's distribution (weight p_gen) with the attention summed per source token id (1 - p_gen). With
    `config.copy_spans` the attention also scores the source positions that continue a span (`SpanGate`); with
    `config.copy_context_window` it reads each source position through `SourceContext`."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.gate = nn.Linear(2 * config.hidden_size, 1)
        self.span_gate = SpanGate(config.hidden_size) if getattr(config, "copy_spans", False) else None
        window = getattr(config, "copy_context_window", 0)
        self.source_context = SourceContext(config.hidden_size, window) if window else None

    def check_decoder_input_ids(self, decoder_input_ids):
        """Refuses a forward without the decoder's token ids where the span gate reads them."""
        if self.span_gate is not None and decoder_input_ids is None:
            raise ValueError(
                "config.copy_spans reads the decoder's token ids: pass `decoder_input_ids`, or `labels` without "
                "`decoder_inputs_embeds`"
            )

    def forward(
        self, hidden_states, logits, encoder_hidden_states, encoder_attention_mask, source_ids, decoder_input_ids=None
    ):
        """The mixture's log-probabilities (B, T, V) and its copy weight 1 - p_gen (B, T). `decoder_input_ids` (B, T):
        the decoder's input tokens at the positions of `hidden_states`, read with `config.copy_spans` only."""
        bias = None
        if self.span_gate is not None:
            self.check_decoder_input_ids(decoder_input_ids)
            continuations = span_continuations(source_ids, decoder_input_ids)
            bias = self.span_gate(hidden_states).to(accumulation_dtype(hidden_states.dtype)) * continuations
        if self.source_context is not None:
            encoder_hidden_states = self.source_context(encoder_hidden_states, encoder_attention_mask)
        query = self.query(hidden_states)
        weights, context = copy_attention(query, encoder_hidden_states, encoder_attention_mask, bias)
        gate = self.gate(torch.cat([hidden_states, context], dim=-1)).squeeze(-1)
        return pointer_generator(logits, weights, source_ids, gate), torch.sigmoid(-gate)


class CopyHeadMixin:
    """What a model with a copy head (`self.copy_head`) adds: the source's token ids it copies, checked and kept by
    generate() for every decoding step, and its modules' initial weights."""

    def _init_weights(self, module):
        if isinstance(module, (SpanGate, SourceContext)):
            module.init_weights()
        else:
            super()._init_weights(module)

    def checked_source_ids(self, source_ids, encoder_hidden_states) -> torch.Tensor:
        """The source ids the copy head reads, refused where missing, of another shape than the encoder's output, or
        (inside `checks.value_checks()`) outside the vocabulary."""
        if source_ids is None:
            raise ValueError(
                "The copy head copies source tokens by their ids: pass `input_ids`, or `source_ids` (the source's "
                "token ids) beside `encoder_outputs` or `inputs_embeds`"
            )
        if source_ids.shape != encoder_hidden_states.shape[:2]:
            raise ValueError(
                f"`source_ids` {tuple(source_ids.shape)} must be the source's ids, one per encoder output position "
                f"{tuple(encoder_hidden_states.shape[:2])}"
            )
        check_inputs(source_ids, None, self.config.get_text_config(decoder=True), name="source_ids")
        return source_ids

    def copy_logits(self, outputs, hidden_states, source_ids, attention_mask, decoder_input_ids, labels, **loss_kwargs):
        """The copy head over `outputs.logits`: (log-probabilities, copy weight, the loss on `labels` or None)."""
        encoder_states = outputs.encoder_last_hidden_state
        source_ids = self.checked_source_ids(source_ids, encoder_states)
        logits, copy_probability = self.copy_head(
            hidden_states, outputs.logits, encoder_states, attention_mask, source_ids, decoder_input_ids
        )
        loss = None if labels is None else ForMaskedLMLoss(logits, labels, logits.shape[-1], **loss_kwargs)
        return logits, copy_probability, loss

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """As transformers'; the source's token ids (`inputs` or `input_ids`) go to every step as `source_ids`, which
        generate() expands with the beams. Beside `encoder_outputs` without ids, pass `source_ids`."""
        source = inputs if inputs is not None else kwargs.get("input_ids")
        if kwargs.get("source_ids") is None and source is not None and not source.is_floating_point():
            kwargs["source_ids"] = source
        return super().generate(inputs, generation_config, **kwargs)


@dataclass
class CopyGenerationOutput(Seq2SeqLMOutput):
    r"""
    `Seq2SeqLMOutput` whose `logits` are the pointer-generator's log-probabilities (B, T, V), read as any logits.

    lm_logits (`torch.FloatTensor` of shape `(batch_size, target_length, vocab_size)`):
        The LM head's own scores, before the mixture.
    copy_probability (`torch.FloatTensor` of shape `(batch_size, target_length)`):
        The weight 1 - p_gen of the copy attention's distribution in the mixture.
    """

    lm_logits: torch.FloatTensor | None = None
    copy_probability: torch.FloatTensor | None = None


class FastformerCopyForConditionalGeneration(CopyHeadMixin, FastformerForConditionalGeneration):
    """`FastformerForConditionalGeneration` with See et al.'s pointer-generator (2017), `FastformerCopyHead`. It reads
    the source's token ids at every step (`input_ids`, or `source_ids` beside `encoder_outputs`), and with
    `config.copy_spans` the decoder's input ids (`decoder_input_ids` or `labels`). `logits` are log-probabilities:
    logits processors that scale scores act on those (`repetition_penalty` barely moves a likely token).
    """

    config_class = FastformerCopyConfig

    def __init__(self, config: FastformerCopyConfig):
        super().__init__(config)
        self.copy_head = FastformerCopyHead(self.config)
        self.post_init()  # the copy head's weights (the rest are initialized already)

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        labels: torch.Tensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        source_ids: torch.Tensor | None = None,
        **kwargs,
    ) -> CopyGenerationOutput:
        r"""
        source_ids: the source's token ids (B, M) that the copy head copies: `input_ids` by default; needed beside
            `encoder_outputs` or `inputs_embeds`. The other arguments are `FastformerForConditionalGeneration`'s.
        """
        if isinstance(logits_to_keep, torch.Tensor) and logits_to_keep.dtype == torch.bool:
            raise ValueError(
                "The copy head keeps the (batch, position) layout: pass `logits_to_keep` as a count or as positions, "
                "not as a boolean mask"
            )
        if labels is not None:
            use_cache = False
            shape = None if decoder_input_ids is None else decoder_input_ids.shape
            labels = checked_token_labels(labels, self.config, shape)
            if decoder_input_ids is None and kwargs.get("decoder_inputs_embeds") is None:
                decoder_input_ids = self.shift_labels_right(labels)
        self.copy_head.check_decoder_input_ids(decoder_input_ids)
        # the head reads the decoder's last hidden state; the other states are returned only where asked for
        hidden_states_asked = kwargs.pop("output_hidden_states", self.config.output_hidden_states)
        outputs = super().forward(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            use_cache=use_cache,
            logits_to_keep=logits_to_keep,
            output_hidden_states=True,
            **kwargs,
        )
        hidden_states = slice_logits_to_keep(outputs.decoder_hidden_states[-1], logits_to_keep)
        if decoder_input_ids is not None:
            decoder_input_ids = slice_logits_to_keep(decoder_input_ids[..., None], logits_to_keep)[..., 0]
        source_ids = source_ids if source_ids is not None else input_ids
        logits, copy_probability, loss = self.copy_logits(
            outputs,
            hidden_states,
            source_ids,
            attention_mask,
            decoder_input_ids,
            labels,
            num_items_in_batch=num_items_in_batch,
        )
        if not hidden_states_asked:
            outputs.decoder_hidden_states = outputs.encoder_hidden_states = None
        return CopyGenerationOutput(
            **{**outputs, "loss": loss, "logits": logits}, lm_logits=outputs.logits, copy_probability=copy_probability
        )


class FastformerCopyForCausalLM(FastformerForCausalLM):
    """`FastformerForCausalLM` under `FastformerCopyConfig`, whose `decoder_conv_kernel` adds the short convolution."""

    config_class = FastformerCopyConfig


# checkpoints name the encoder-decoder's parts as `FastformerForConditionalGeneration`'s do
register_checkpoint_conversion_mapping(
    FastformerCopyForConditionalGeneration.__name__,
    get_checkpoint_conversion_mapping(FastformerForConditionalGeneration.__name__),
    overwrite=True,
)

__all__ = ["CopyGenerationOutput", "FastformerCopyForCausalLM", "FastformerCopyForConditionalGeneration"]
