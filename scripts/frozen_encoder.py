"""A frozen encoder for a decoder-only fine-tune of an encoder-decoder (run_summarization.py `--freeze_encoder`,
`--cache_encoder_states`; benchmarks/quality): its parameters fixed, its word embeddings untied from the decoder's
first, and its output computed once per source and reused (`CachedEncoderStates`)."""

import torch
from torch import nn
from transformers.modeling_outputs import BaseModelOutput


def encoder_layers(encoder) -> list:
    """The encoder's layers in order: a Fastformer's (one per application: `applied_layers`) or a BERT's."""
    if hasattr(encoder, "applied_layers"):
        return [layer for _, layer in encoder.applied_layers()]
    return list(encoder.encoder.layer)


def untie_encoder_embeddings(model) -> None:
    """Gives a Fastformer encoder-decoder's encoder word embeddings of its own, a copy of the shared matrix, so that
    training the decoder and the LM head (which keep sharing theirs) leaves the encoder's as they are;
    `config.tie_encoder_embeddings` becomes False, is saved with the model, and ties the same way on loading."""
    if not model.config.tie_encoder_embeddings:
        return
    encoder = model.get_encoder()
    shared = encoder.get_input_embeddings()
    own = nn.Embedding(shared.num_embeddings, shared.embedding_dim, padding_idx=shared.padding_idx)
    own.weight = nn.Parameter(shared.weight.detach().clone(), requires_grad=shared.weight.requires_grad)
    encoder.set_input_embeddings(own)
    model.config.tie_encoder_embeddings = False  # the model's tied weights follow it
    model.all_tied_weights_keys = model.get_expanded_tied_weights_keys(all_submodels=True)


def freeze_encoder(model, train_top_layers: int = 0) -> None:
    """No gradient for any of the encoder's parameters, its word embeddings included: a Fastformer encoder-decoder's
    encoder first gets embeddings of its own (`untie_encoder_embeddings`), so that training the decoder leaves the
    encoder as it was. Refuses a model whose encoder still shares a parameter with the decoder or the LM head.
    `train_top_layers`: the encoder's last layers that still train (refused where they are also lower layers, as
    with a Fastformer's `share_layers`)."""
    if getattr(model.config, "tie_encoder_embeddings", False):
        untie_encoder_embeddings(model)
    shared = {id(parameter) for parameter in model.get_decoder().parameters()}
    shared |= {id(parameter) for parameter in model.get_output_embeddings().parameters()}
    encoder = dict(model.get_encoder().named_parameters())
    also_decoders = [name for name, parameter in encoder.items() if id(parameter) in shared]
    if also_decoders:  # e.g. BART's and T5's shared word embeddings, which their checkpoints tie again on loading
        raise ValueError(
            f"The encoder's {', '.join(also_decoders)} are also the decoder's: a frozen encoder would still change"
        )
    layers = encoder_layers(model.get_encoder())
    if not 0 <= train_top_layers <= len(layers):
        raise ValueError(f"train_top_layers must be between 0 and the encoder's {len(layers)} layers")
    top = layers[len(layers) - train_top_layers :]
    if any(layer in layers[: len(layers) - train_top_layers] for layer in top):
        raise ValueError("The encoder's top layers are also its lower ones (shared layers): they cannot train alone")
    for parameter in encoder.values():
        parameter.requires_grad_(False)
    for layer in top:
        layer.requires_grad_(True)


@torch.no_grad()
def token_state_spread(encoder, input_ids, attention_mask=None, positions: int = 50, **_) -> float:
    """How far apart an encoder keeps its tokens: the mean over features of the last-layer states' standard
    deviation across the first `positions` positions (0: every token alike, as after a collapse: fine-tuning a
    warm-started encoder through a new, random cross-attention does that, docs/RESULTS.md)."""
    states = encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return states[:, :positions].std(dim=1).mean().item()


class CachedEncoderStates:
    """Wraps a data collator: every batch also gets `encoder_outputs`, the frozen encoder's output (eval mode, no
    gradient), computed once per distinct source and reused in every epoch, at evaluation and in generate(), so a
    training step costs the decoder only. Only for an encoder that does not change (`freeze_encoder`): the cache
    holds each source's states on the CPU, (real tokens, hidden size) each. The encoder then runs without dropout
    in training too (a frozen encoder run in every step would apply its dropout). For a DataLoader in this
    process (`dataloader_num_workers=0`): a worker process would keep a cache of its own and run the model.
    `sources` (lists of token ids, e.g. every split's `input_ids`) are encoded at the first call, sorted by length
    (`encode_all`), so that the time is counted where the states are first needed."""

    def __init__(self, collator, model, sources=(), batch_size: int = 32):
        self.collator, self.model = collator, model
        self.states = {}  # the real tokens' ids (bytes) -> their encoder states
        self.sources, self.batch_size = list(sources), batch_size

    def __call__(self, features):
        if self.sources:
            sources, self.sources = self.sources, []
            self.encode_all(sources, self.batch_size)
        batch = self.collator(features)
        ids, mask = batch["input_ids"], batch["attention_mask"].to(torch.bool)
        keys = [row[real].numpy().tobytes() for row, real in zip(ids, mask)]
        missing = [index for index, key in enumerate(keys) if key not in self.states]
        if missing:
            self._encode(ids[missing], mask[missing], [keys[index] for index in missing])
        hidden = torch.zeros(*ids.shape, self.states[keys[0]].shape[-1], dtype=self.states[keys[0]].dtype)
        for row, key in enumerate(keys):
            hidden[row, mask[row]] = self.states[key]
        batch["encoder_outputs"] = BaseModelOutput(last_hidden_state=hidden)
        return batch

    def encode_all(self, sources, batch_size: int = 32) -> None:
        """Caches the states of every one of `sources` (lists of token ids) not cached yet, in batches of sources of
        about the same length: the collator's batches come in random order and pad every source to the longest
        (2.4x the real tokens in the bundled headlines' batches of 16 at source 2,048), sorted ones hardly at all.
        The states are the ones a collated batch would get."""
        pending = {}
        for ids in sources:
            ids = torch.tensor(ids, dtype=torch.long)
            pending.setdefault(ids.numpy().tobytes(), ids)
        keys = sorted((key for key in pending if key not in self.states), key=lambda key: len(pending[key]))
        for start in range(0, len(keys), batch_size):
            chunk = keys[start : start + batch_size]
            rows = [pending[key] for key in chunk]
            ids = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True)
            mask = torch.nn.utils.rnn.pad_sequence(
                [torch.ones_like(row, dtype=torch.bool) for row in rows], batch_first=True
            )
            self._encode(ids, mask, chunk)

    @torch.no_grad()
    def _encode(self, ids, mask, keys):
        encoder = self.model.get_encoder()
        training = encoder.training
        device = next(encoder.parameters()).device
        try:
            states = encoder.eval()(input_ids=ids.to(device), attention_mask=mask.to(device)).last_hidden_state.cpu()
        finally:
            encoder.train(training)
        for row, key in enumerate(keys):
            self.states[key] = states[row, mask[row]]
