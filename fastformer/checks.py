"""Input checks: a ValueError naming the argument, the expected and the given value. Shapes and dtypes are always
checked; values (ids, labels, token types) only inside `value_checks()`, as reading them waits for the device."""

import contextlib
import contextvars

import torch

IGNORE_INDEX = -100  # labels the losses skip, as in transformers


# per thread and asyncio task: one request's `value_checks()` leaves the others' as they are
_VALUE_CHECKS = contextvars.ContextVar("fastformer_value_checks", default=False)


@contextlib.contextmanager
def value_checks(enabled: bool = True):
    """`with value_checks():` the models read their inputs' values and name a bad one (else it fails inside torch)."""
    token = _VALUE_CHECKS.set(bool(enabled))
    try:
        yield
    finally:
        _VALUE_CHECKS.reset(token)


def values_checked() -> bool:
    """Whether the checks read values: inside `value_checks()`, outside torch.compile."""
    return not torch.compiler.is_compiling() and _VALUE_CHECKS.get()  # dynamo cannot trace a ContextVar


def _values_outside(tensor, low, high, allowed=()):
    """The first value of `tensor` outside [low, high) and not in `allowed`; None if none or not `values_checked()`."""
    if tensor.numel() == 0 or not values_checked():
        return None
    smallest, largest = torch.aminmax(tensor)
    if low <= smallest.item() and largest.item() < high:  # the usual case, in one reduction
        return None
    bad = (tensor < low) | (tensor >= high)
    for value in allowed:
        bad &= tensor != value
    return tensor[bad][0].item() if bad.any() else None


def _check_integer(tensor, name, meaning):
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise ValueError(f"`{name}` must hold integer {meaning} (e.g. torch.long), got dtype {tensor.dtype}")


def _check_not_empty(tensor, name):
    if tensor.shape[1] == 0:
        raise ValueError(f"`{name}` has no token (seq_len 0): pass at least one token per sequence")


def check_position_ids(position_ids, shape, max_positions: int):
    """Positions for inputs of `shape` (batch, seq_len): integers in [0, max_positions), (batch or 1, seq_len)."""
    batch, length = shape
    if position_ids.dim() != 2 or position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch):
        raise ValueError(
            f"`position_ids` must have shape (batch, seq_len) = {(batch, length)} or (1, {length}), got "
            f"{tuple(position_ids.shape)}"
        )
    _check_integer(position_ids, "position_ids", "positions")
    bad = _values_outside(position_ids, 0, max_positions)
    if bad is not None:
        raise ValueError(
            f"`position_ids` holds {bad}, outside [0, {max_positions}): positions must be below the config's "
            "`max_position_embeddings`"
        )


def check_inputs(input_ids, inputs_embeds, config, name="input_ids") -> tuple[int, int]:
    """Exactly one of token ids (batch, seq_len) or embeddings (batch, seq_len, embedding_size), named `name` in the
    messages; returns (batch, seq_len)."""
    embeds_name = name.replace("input_ids", "inputs_embeds")
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"Pass exactly one of `{name}` and `{embeds_name}`")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.embedding_width:
            raise ValueError(
                f"`{embeds_name}` must have shape (batch, seq_len, embedding_size={config.embedding_width}), "
                f"got {tuple(inputs_embeds.shape)}"
            )
        _check_not_empty(inputs_embeds, embeds_name)
        return tuple(inputs_embeds.shape[:2])
    if input_ids.dim() != 2:
        raise ValueError(f"`{name}` must have shape (batch, seq_len), got {tuple(input_ids.shape)}")
    _check_not_empty(input_ids, name)
    _check_integer(input_ids, name, "token ids")
    bad = _values_outside(input_ids, 0, config.vocab_size)
    if bad is not None:
        raise ValueError(
            f"`{name}` holds the id {bad}, outside the vocabulary [0, {config.vocab_size}): the tokenizer and the "
            "model's `vocab_size` do not match (resize_token_embeddings after adding tokens)"
        )
    return tuple(input_ids.shape)


def checked_token_labels(labels, config, shape=None) -> torch.Tensor:
    """Per-token labels, ids or -100, of shape (batch, seq_len) or `shape`, as contiguous long (losses `view` them)."""
    expected = "(batch, seq_len)" if shape is None else str(tuple(shape))
    if labels.dim() != 2 or (shape is not None and tuple(labels.shape) != tuple(shape)):
        raise ValueError(f"`labels` must have shape {expected}, got {tuple(labels.shape)}")
    _check_integer(labels, "labels", "token ids")
    bad = _values_outside(labels, 0, config.vocab_size, allowed=(IGNORE_INDEX,))
    if bad is not None:
        raise ValueError(
            f"`labels` holds {bad}: token labels must be ids in [0, {config.vocab_size}) or {IGNORE_INDEX} (ignored)"
        )
    return labels.long().contiguous()  # int32 ids (numpy, pandas) as torch's losses take them


def checked_classification_labels(labels, config, batch_size) -> torch.Tensor:
    """Labels as transformers' sequence-classification loss reads them for its problem type, contiguous."""
    num_labels = config.num_labels
    problem_type = config.problem_type
    if problem_type is None:  # transformers' inference, so that the message names the type it would pick
        if num_labels == 1:
            problem_type = "regression"
        elif labels.dtype in (torch.long, torch.int):
            problem_type = "single_label_classification"
        else:
            problem_type = "multi_label_classification"
    given = f"got shape {tuple(labels.shape)} and dtype {labels.dtype}"
    if problem_type == "single_label_classification":
        if labels.numel() != batch_size or labels.dtype.is_floating_point or labels.dtype == torch.bool:
            raise ValueError(
                f"single_label_classification needs `labels` of shape (batch,) = ({batch_size},), integer class "
                f"ids, {given}"
            )
        bad = _values_outside(labels, 0, num_labels, allowed=(IGNORE_INDEX,))
        if bad is not None:
            raise ValueError(
                f"`labels` holds {bad}, but num_labels is {num_labels}: class ids must be in [0, {num_labels}) "
                f"(or {IGNORE_INDEX}); set num_labels in the config to the number of classes"
            )
        labels = labels.long()  # int32 class ids (numpy, pandas) as torch's cross-entropy takes them
    elif problem_type == "multi_label_classification":
        if tuple(labels.shape) != (batch_size, num_labels) or not labels.dtype.is_floating_point:
            hint = " (integer class ids need torch.long labels)" if labels.dim() == 1 else ""
            raise ValueError(
                f"multi_label_classification needs float `labels` of shape (batch, num_labels) = "
                f"({batch_size}, {num_labels}), {given}{hint}"
            )
    elif labels.numel() != batch_size * num_labels or not labels.dtype.is_floating_point:  # regression
        raise ValueError(
            f"regression needs float `labels` with num_labels={num_labels} value(s) per sequence "
            f"(batch={batch_size}), {given}"
        )
    return labels.contiguous()


def check_token_type_ids(token_type_ids: torch.Tensor, shape: tuple[int, int], type_vocab_size: int):
    """Token types for inputs of `shape` (batch, seq_len): integers in [0, type_vocab_size), of that shape."""
    if tuple(token_type_ids.shape) != tuple(shape):
        raise ValueError(
            f"`token_type_ids` must have shape (batch, seq_len) = {tuple(shape)}, got {tuple(token_type_ids.shape)}"
        )
    _check_integer(token_type_ids, "token_type_ids", "token types")
    bad = _values_outside(token_type_ids, 0, type_vocab_size)
    if bad is not None:
        raise ValueError(
            f"`token_type_ids` holds {bad}, outside [0, {type_vocab_size}): token types are a text's (0) or a "
            "pair's second text's (1), as BERT's"
        )


# transformers' keywords for flash-attention's packed rows (`TransformersKwargs`), which Fastformer does not read
FLASH_PACKING_KEYWORDS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k", "seq_idx")


def check_keywords(kwargs: dict, owner: str, causal: bool):
    """Refuses keywords of a forward's `**kwargs` that `owner` cannot honour: cross-attention inputs, a cache given to
    an encoder (not `causal`), another `is_causal`, flash-attention's packing keywords."""
    cross = [name for name in ("encoder_hidden_states", "encoder_attention_mask") if kwargs.get(name) is not None]
    if cross:
        raise ValueError(
            f"{owner} has no cross-attention to read `{'`, `'.join(cross)}` with: a decoder that reads an encoder's "
            "output is FastformerForConditionalGeneration's"
        )
    if not causal and kwargs.get("cache") is not None:
        raise ValueError(
            f"{owner} keeps no generation state, but was given a cache ({type(kwargs['cache']).__name__}): "
            "generation is FastformerForCausalLM's and FastformerForConditionalGeneration's"
        )
    is_causal = kwargs.get("is_causal")
    if is_causal is not None and bool(is_causal) != causal:
        kind = "causal (every token reads its prefix)" if causal else "bidirectional (every token reads all)"
        raise ValueError(f"{owner} is {kind}: it cannot take `is_causal={is_causal}`")
    flash = [name for name in FLASH_PACKING_KEYWORDS if kwargs.get(name) is not None]
    if flash:
        raise ValueError(
            f"{owner} reads packed rows from `position_ids` that restart at each sequence (the default of "
            f"DataCollatorWithFlattening), not from flash-attention's {', '.join(flash)}: leave "
            "return_flash_attn_kwargs and return_seq_idx off"
        )
