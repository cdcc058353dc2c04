"""See et al.'s pointer-generator (2017) for encoder-decoders: the copy head, and what a model with one needs to
keep the source's token ids for every decoding step. `FastformerForConditionalGeneration` uses it with
`config.copy_mechanism`, and so does the BERT2BERT baseline (`fastformer.copy_encoder_decoder`)."""

import torch
from torch import nn
from transformers import initialization as init

from .checks import check_inputs
from .configuration_fastformer import FastformerConfig, check_copy_context_window
from .functional import accumulation_dtype, copy_attention, pointer_generator, source_context, span_continuations


class SpanGate(nn.Linear):
    """The copy head's span gate g_t = u . h_t + c (`config.copy_spans`), which starts at u = 0 and c = 4: a span's
    continuation starts e^4 (about 55) times as likely to be copied as any other source token."""

    initial_bias = 4.0

    def __init__(self, hidden_size: int):
        super().__init__(hidden_size, 1)

    def init_weights(self):
        """The initial weights, for the model's `_init_weights` (transformers' `init`: loaded weights stay)."""
        init.zeros_(self.weight)
        init.constant_(self.bias, self.initial_bias)


class SourceContext(nn.Module):
    """The copy head's source states with their neighbours (`config.copy_context_window`): every encoder output plus
    a learned depthwise convolution of the window centred on it (`functional.source_context`; `weight` (D, 1, W) as
    a depthwise `nn.Conv1d`'s), starting at zero (the encoder's outputs, as without it). It runs at every decoding
    step over the whole source: W x M x D multiply-adds for M source tokens, W times the copy attention's scores."""

    def __init__(self, hidden_size: int, window: int):
        super().__init__()
        check_copy_context_window(window)
        self.weight = nn.Parameter(torch.zeros(hidden_size, 1, window))

    def init_weights(self):
        """The initial weights, for the model's `_init_weights` (transformers' `init`: loaded weights stay)."""
        init.zeros_(self.weight)

    def forward(self, source, source_mask=None):  # (B, M, D), (B, M)
        return source_context(source, self.weight, source_mask)


class FastformerCopyHead(nn.Module):
    """The pointer-generator of See et al. (2017) (`config.copy_mechanism`): each decoder output h_t attends over
    the encoder output (`functional.copy_attention`, one head of its own: query W h_t), and a gate
    p_gen = sigmoid(w . [h_t ; context_t] + b) mixes the LM head's distribution (weight p_gen) with the attention
    summed per source token id (1 - p_gen): `functional.pointer_generator`, log-probabilities (B, T, V).

    With `config.copy_spans` the attention also scores the source positions that continue a span (those whose
    previous token is the decoder's input token t, `functional.span_continuations`), by a learned gate
    g_t = u . h_t + c: the pointer can copy a span in order, as an induction head does in softmax attention (additive
    attention has no token-to-token scores to form one).

    With `config.copy_context_window` the attention reads each source position through `SourceContext`: its encoder
    output and its neighbours', so that where a span may start or stop is scored from the tokens around it."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.gate = nn.Linear(2 * config.hidden_size, 1)
        self.span_gate = SpanGate(config.hidden_size) if getattr(config, "copy_spans", False) else None
        window = getattr(config, "copy_context_window", 0)
        self.source_context = SourceContext(config.hidden_size, window) if window else None

    def check_decoder_input_ids(self, decoder_input_ids):
        """Refuses a forward without the decoder's token ids where the span gate reads them (checked before the
        decoder runs)."""
        if self.span_gate is not None and decoder_input_ids is None:
            raise ValueError(
                "config.copy_spans reads the decoder's token ids: pass `decoder_input_ids`, or `labels` without "
                "`decoder_inputs_embeds`"
            )

    def forward(
        self, hidden_states, logits, encoder_hidden_states, encoder_attention_mask, source_ids, decoder_input_ids=None
    ):
        """`decoder_input_ids` (B, T): the decoder's input tokens at the positions of `hidden_states`, read with
        `config.copy_spans` only."""
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
        return pointer_generator(logits, weights, source_ids, gate)


class CopyHeadSourceMixin:
    """The source's token ids that a copy head (`self.copy_head`, None without one) copies: checked against the
    encoder's output, and kept by generate() for every decoding step. For `FastformerForConditionalGeneration`
    and for the BERT2BERT baseline with the same head (`fastformer.copy_encoder_decoder`)."""

    def checked_source_ids(self, source_ids, encoder_hidden_states) -> torch.Tensor:
        """The source ids the copy head reads, refused where there are none, where they do not match the encoder's
        output in shape, or (inside `checks.value_checks()`) hold an id outside the vocabulary."""
        if source_ids is None:
            raise ValueError(
                "config.copy_mechanism copies source tokens by their ids: pass `input_ids`, or `source_ids` (the "
                "source's token ids) beside `encoder_outputs` or `inputs_embeds`"
            )
        if source_ids.shape != encoder_hidden_states.shape[:2]:
            raise ValueError(
                f"`source_ids` {tuple(source_ids.shape)} must be the source's ids, one per encoder output position "
                f"{tuple(encoder_hidden_states.shape[:2])}"
            )
        check_inputs(source_ids, None, self.config.get_text_config(decoder=True), name="source_ids")
        return source_ids

    def _maybe_prepare_encoder_kwargs_for_generation(self, inputs_tensor, model_kwargs, model_input_name, *args):
        """As generate()'s, and with the copy head the source's ids are kept for every step (as `source_ids`,
        expanded with the beams like the encoder's output). With `encoder_outputs` and no `input_ids`, generate()
        stands -100 in for the ids: then `source_ids` must be given."""
        given_states = model_kwargs.get("encoder_outputs") is not None
        model_kwargs = super()._maybe_prepare_encoder_kwargs_for_generation(
            inputs_tensor, model_kwargs, model_input_name, *args
        )
        source_is_ids = (model_input_name or self.main_input_name) == "input_ids"
        if self.copy_head is not None and model_kwargs.get("source_ids") is None and source_is_ids:
            # one look at the values per generate() call, only beside given encoder outputs
            if not (given_states and bool((inputs_tensor == -100).all())):
                model_kwargs["source_ids"] = inputs_tensor
        return model_kwargs
