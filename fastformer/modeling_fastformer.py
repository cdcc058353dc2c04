"""Fastformer models for transformers: the encoder and its task heads.

Class chain: FastformerAttention -> FastformerLayer -> FastformerPreTrainedModel -> FastformerModel ->
FastformerFor<Task>. The layer is BERT-style post-LN, as in the authors' code: additive attention (with the
output transform W_r and the query residual) -> dense -> dropout -> add & LayerNorm -> feed-forward -> add &
LayerNorm. This file imports the package only relatively, so a saved checkpoint carries it as Hub code.
"""

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutputWithPooling, MaskedLMOutput, SequenceClassifierOutput
from transformers.utils.generic import can_return_tuple

from .configuration_fastformer import FastformerConfig
from .functional import additive_attention, masked_softmax


class FastformerEmbeddings(nn.Module):
    """Token + learned position embeddings, LayerNorm, dropout."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids=None, position_ids=None, inputs_embeds=None) -> torch.Tensor:
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        embeddings = inputs_embeds + self.position_embeddings(position_ids)
        return self.dropout(self.layer_norm(embeddings))


class FastformerAttention(nn.Module):
    """Additive attention over all heads (Eqs. 3-6), then r_i = W_r u_i and the query residual r_i + q_i."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = hidden_size // self.num_heads
        self.interaction = config.interaction

        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        # query-value sharing: v_i = q_i, so there is no W_v at all
        self.value = None if config.share_query_value else nn.Linear(hidden_size, hidden_size)
        self.transform = nn.Linear(hidden_size, hidden_size)  # W_r

        # w_q and w_k are Fastformer's only per-head parameters; head-wise sharing keeps one of each
        heads = 1 if config.share_heads else self.num_heads
        self.query_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        self.key_weight = nn.Parameter(torch.empty(heads, self.head_dim))
        if config.interaction == "concat":
            self.query_key_projection = nn.Parameter(torch.empty(heads, 2 * self.head_dim, self.head_dim))
            self.key_value_projection = nn.Parameter(torch.empty(heads, 2 * self.head_dim, self.head_dim))
        else:
            self.query_key_projection = self.key_value_projection = None

    def _per_head(self, parameter):
        if parameter is None:
            return None
        return parameter.expand(self.num_heads, *parameter.shape[1:])

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        batch_size, seq_length, _ = hidden_states.shape

        def split_heads(x):  # (B, N, H*D) -> (B, H, N, D)
            return x.view(batch_size, seq_length, self.num_heads, self.head_dim).transpose(1, 2)

        query = self.query(hidden_states)  # (B, N, H*D)
        key = self.key(hidden_states)
        value = query if self.value is None else self.value(hidden_states)
        out = additive_attention(
            split_heads(query),
            split_heads(key),
            split_heads(value),
            self._per_head(self.query_weight),
            self._per_head(self.key_weight),
            attention_mask,
            interaction=self.interaction,
            query_key_projection=self._per_head(self.query_key_projection),
            key_value_projection=self._per_head(self.key_value_projection),
            return_weights=output_attentions,
        )
        u, weights = out if output_attentions else (out, None)
        u = u.transpose(1, 2).reshape(batch_size, seq_length, -1)  # (B, N, H*D)
        return self.transform(u) + query, weights


class FastformerLayer(GradientCheckpointingLayer):
    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.attention = FastformerAttention(config)
        self.attention_output = nn.Linear(config.hidden_size, config.hidden_size)
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.activation = ACT2FN[config.hidden_act]
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)
        self.output_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        attention, weights = self.attention(hidden_states, attention_mask, output_attentions)
        hidden_states = self.attention_norm(hidden_states + self.dropout(self.attention_output(attention)))
        feed_forward = self.output(self.activation(self.intermediate(hidden_states)))
        hidden_states = self.output_norm(hidden_states + self.dropout(feed_forward))
        return hidden_states, weights


class FastformerPooler(nn.Module):
    """Pools the last layer into one vector per sequence, ignoring padding (`config.pooler_type`)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.pooler_type = config.pooler_type
        if self.pooler_type == "additive":
            # the paper's attention pooling: a small tanh MLP scores each token
            self.dense = nn.Linear(config.hidden_size, config.hidden_size)
            self.score = nn.Linear(config.hidden_size, 1)

    def forward(self, hidden_states, attention_mask=None) -> torch.Tensor:
        if attention_mask is None:
            attention_mask = torch.ones(hidden_states.shape[:2], dtype=torch.bool, device=hidden_states.device)
        attention_mask = attention_mask.to(torch.bool)
        if self.pooler_type == "cls":
            first_token = attention_mask.int().argmax(dim=-1)  # left padding puts the first token later
            return hidden_states[torch.arange(hidden_states.shape[0], device=hidden_states.device), first_token]
        if self.pooler_type == "mean":
            weights = attention_mask / attention_mask.sum(dim=-1, keepdim=True).clamp(min=1)
        else:
            logits = self.score(torch.tanh(self.dense(hidden_states))).squeeze(-1)  # (B, N)
            weights = masked_softmax(logits, attention_mask)
        return (weights.to(hidden_states.dtype).unsqueeze(1) @ hidden_states).squeeze(1)  # (B, hidden)


class FastformerPreTrainedModel(PreTrainedModel):
    config_class = FastformerConfig
    base_model_prefix = "fastformer"
    supports_gradient_checkpointing = True
    _no_split_modules = ["FastformerEmbeddings", "FastformerLayer"]

    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, FastformerAttention):
            for parameter in (
                module.query_weight,
                module.key_weight,
                module.query_key_projection,
                module.key_value_projection,
            ):
                if parameter is not None:
                    init.normal_(parameter, mean=0.0, std=self.config.initializer_range)

    def save_pretrained(self, save_directory, *args, **kwargs):
        # transformers writes an auto_map entry for the saved class only; list every head, so that one
        # checkpoint loads into any of them as Hub code (trust_remote_code=True) without this package
        self.config.auto_map = {
            "AutoConfig": f"{FastformerConfig.__module__.rsplit('.', 1)[-1]}.{FastformerConfig.__name__}",
            **{cls._auto_class: f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}" for cls in AUTO_CLASSES},
        }
        return super().save_pretrained(save_directory, *args, **kwargs)


class FastformerModel(FastformerPreTrainedModel):
    """The bare Fastformer encoder.

    `attentions` (with `output_attentions=True`) holds, per applied layer, the two additive-attention pooling
    distributions as a tensor of shape (batch, num_heads, 2, seq_len): [:, :, 0] is alpha (the weights that
    pool the global query), [:, :, 1] is beta (the weights that pool the global key). Padding gets 0.
    Without `position_ids`, positions count real tokens only, so left padding does not shift them.
    """

    def __init__(self, config: FastformerConfig, add_pooling_layer: bool = True):
        super().__init__(config)
        self.embeddings = FastformerEmbeddings(config)
        # layer-wise sharing: one layer, applied num_hidden_layers times
        self.layers = nn.ModuleList(
            FastformerLayer(config) for _ in range(1 if config.share_layers else config.num_hidden_layers)
        )
        self.pooler = FastformerPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPooling:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("Pass exactly one of `input_ids` and `inputs_embeds`")
        # accepted so that BERT tokenizers work as they are; Fastformer has no segment embeddings
        if token_type_ids is not None and token_type_ids.any():
            raise ValueError(
                "Fastformer has no token type (segment) embeddings, but `token_type_ids` has non-zero values: "
                "encode one text per sequence, or drop `token_type_ids`"
            )
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        batch_size, seq_length = input_ids.shape if input_ids is not None else inputs_embeds.shape[:2]
        if seq_length > self.config.max_position_embeddings:
            raise ValueError(
                f"The input has {seq_length} tokens but `max_position_embeddings` is "
                f"{self.config.max_position_embeddings}: truncate it or use a config with more positions"
            )
        if attention_mask is not None and tuple(attention_mask.shape) != (batch_size, seq_length):
            raise ValueError(
                f"`attention_mask` must have shape (batch, seq_len) = {(batch_size, seq_length)}, "
                f"got {tuple(attention_mask.shape)}"
            )
        if position_ids is None:
            if attention_mask is None:
                device = (input_ids if input_ids is not None else inputs_embeds).device
                position_ids = torch.arange(seq_length, device=device).expand(batch_size, -1)
            else:
                position_ids = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0)

        hidden_states = self.embeddings(input_ids, position_ids, inputs_embeds)
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for index in range(self.config.num_hidden_layers):
            layer = self.layers[index % len(self.layers)]
            hidden_states, weights = layer(hidden_states, attention_mask, output_attentions)
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (weights,)

        return BaseModelOutputWithPooling(
            last_hidden_state=hidden_states,
            pooler_output=self.pooler(hidden_states, attention_mask) if self.pooler is not None else None,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )


class FastformerForSequenceClassification(FastformerPreTrainedModel):
    """Fastformer with a linear classifier on the pooled output (`config.pooler_type`).

    `config.problem_type` selects the loss as in transformers: "regression" (MSE), "single_label_classification"
    (cross-entropy) or "multi_label_classification" (BCE with logits); inferred from the labels when unset.
    """

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.fastformer = FastformerModel(config)
        dropout = config.hidden_dropout_prob if config.classifier_dropout is None else config.classifier_dropout
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> SequenceClassifierOutput:
        outputs = self.fastformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        logits = self.classifier(self.dropout(outputs.pooler_output))
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        return SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


class FastformerLMHead(nn.Module):
    """dense -> activation -> LayerNorm -> vocabulary projection (tied to the input embeddings by default)."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.hidden_act]
        self.layer_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size)

    def forward(self, hidden_states) -> torch.Tensor:
        return self.decoder(self.layer_norm(self.activation(self.dense(hidden_states))))


class FastformerForMaskedLM(FastformerPreTrainedModel):
    """Fastformer with a masked-language-modeling head, for pretraining; labels are -100 where not masked."""

    _tied_weights_keys = {"lm_head.decoder.weight": "fastformer.embeddings.word_embeddings.weight"}
    # the Trainer passes num_items_in_batch, so the loss stays exact under gradient accumulation
    accepts_loss_kwargs = True

    def __init__(self, config: FastformerConfig):
        super().__init__(config)
        self.fastformer = FastformerModel(config, add_pooling_layer=False)
        self.lm_head = FastformerLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.lm_head.decoder

    def set_output_embeddings(self, new_embeddings):
        self.lm_head.decoder = new_embeddings

    @can_return_tuple
    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        token_type_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> MaskedLMOutput:
        outputs = self.fastformer(
            input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            token_type_ids=token_type_ids,
            return_dict=True,
        )
        logits = self.lm_head(outputs.last_hidden_state)
        loss = None
        if labels is not None:
            loss = self.loss_function(
                logits, labels, vocab_size=self.config.vocab_size, num_items_in_batch=num_items_in_batch
            )
        return MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )


AUTO_CLASSES = {
    FastformerModel: "AutoModel",
    FastformerForSequenceClassification: "AutoModelForSequenceClassification",
    FastformerForMaskedLM: "AutoModelForMaskedLM",
}
for _cls, _auto_class in AUTO_CLASSES.items():
    _cls.register_for_auto_class(_auto_class)

__all__ = [
    "FastformerForMaskedLM",
    "FastformerForSequenceClassification",
    "FastformerModel",
    "FastformerPreTrainedModel",
]
