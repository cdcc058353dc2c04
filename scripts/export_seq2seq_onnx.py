"""Exports a `FastformerForConditionalGeneration` to ONNX as two graphs, the encoder and one decoding step with the
decoder's state as inputs and outputs, and runs greedy decoding on them with ONNX Runtime (docs/DEPLOY.md).

    python scripts/export_seq2seq_onnx.py --model_name_or_path runs/headlines-minilm --output_dir runs/onnx
"""

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache

from fastformer.export import EXAMPLE_SHAPE, example_inputs, exported_attention_mode, using_attention_mode
from fastformer.functional import CausalAttentionState, PoolingState, initial_pooling_state


class Seq2SeqEncoderGraph(torch.nn.Module):
    """A `FastformerForConditionalGeneration`'s encoder side: (input_ids, attention_mask) -> each decoder layer's
    cross-attention (key, value) (`FastformerCrossAttention.encode`), flat; with the copy head, then the encoder's
    output."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        encoded = self.model.get_encoder()(input_ids, attention_mask=attention_mask).last_hidden_state
        layers = self.model.get_decoder().layers
        pairs = (layer.cross_attention.encode(encoded, attention_mask) for layer in layers)
        # new tensors for every output: the additive cross-attention's key and value are one tensor
        cross = tuple(tensor.clone() for pair in pairs for tensor in pair)
        return (*cross, encoded) if getattr(self.model, "copy_head", None) is not None else cross


def state_tensors(cache: Cache) -> list[torch.Tensor]:
    """A decoder cache's states, flat: per layer its recurrent states, then its short convolution's, if any."""
    return [
        state
        for layer in cache.layers
        for states in (layer.recurrent_states, layer.conv_states)
        for state in states.values()
        if state is not None
    ]


def load_state_tensors(cache: Cache, tensors, config=None):
    """Sets the states of `cache` from `state_tensors` of a cache of `config` (None: no short convolutions)."""
    tensors = iter(tensors)
    for layer in cache.layers:
        query, key = (PoolingState(next(tensors), next(tensors)) for _ in range(2))
        layer.update_attention_state(CausalAttentionState(query, key), tokens=0)
        if config is not None and config.convolution_kernel:
            layer.update_conv_state(next(tensors))


class DecoderStepGraph(torch.nn.Module):
    """One decoding step of a `FastformerForConditionalGeneration` as a pure function of its state: (input_ids
    (B, 1), positions (B,), encoder_attention_mask (B, M), cross: the encoder graph's outputs, state:
    `state_tensors(cache)`, source_ids (B, M), for the copy head) -> (logits (B, vocab), positions + 1, new state)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, positions, encoder_attention_mask, cross, state, source_ids=None):
        model, decoder = self.model, self.model.get_decoder()
        states = DynamicCache(config=model.config)
        load_state_tensors(states, state, model.config)
        cross_cache = DynamicCache()
        for index in range(len(decoder.layers)):
            cross_cache.update(cross[2 * index], cross[2 * index + 1], index)
        cache = EncoderDecoderCache(states, cross_cache)
        hidden_states = decoder(
            input_ids, position_ids=positions[:, None], encoder_attention_mask=encoder_attention_mask, cache=cache
        ).last_hidden_state[:, -1:]
        logits = model.lm_head(hidden_states)
        if getattr(model, "copy_head", None) is not None:  # the encoder's output is the last of `cross`
            logits, _ = model.copy_head(hidden_states, logits, cross[-1], encoder_attention_mask, source_ids, input_ids)
        return logits[:, -1], positions + 1, tuple(state_tensors(states))


def initial_state(config, batch_size: int) -> list[torch.Tensor]:
    """The decoding state before the first token, as `DecoderStepGraph` takes it."""
    heads, dim = config.num_attention_heads, config.hidden_size // config.num_attention_heads
    state = []
    for _ in range(config.num_decoder_layers):
        # new tensors for every slot: the same tensor twice would be traced as one input
        state += [tensor for _ in range(2) for tensor in initial_pooling_state(batch_size, heads, dim)]
        if config.convolution_kernel:
            state.append(torch.zeros(batch_size, config.hidden_size, config.convolution_kernel - 1))
    return state


def export_seq2seq_onnx(model, folder: str | Path) -> dict[str, Path]:
    """Writes a `FastformerForConditionalGeneration` (eval mode) to `folder` as encoder.onnx (input_ids,
    attention_mask -> cross.{i}) and decoder_step.onnx (input_ids, positions, encoder_attention_mask, cross.{i},
    state.{i}, with the copy head source_ids -> logits, positions_out, state_out.{i}), batch and source length
    dynamic; returns their paths. A graph may leave out an input it does not read."""
    # by name: a model loaded as Hub code has classes of its own
    if "FastformerForConditionalGeneration" not in {cls.__name__ for cls in type(model).__mro__}:
        raise ValueError(
            f"export_seq2seq_onnx exports a FastformerForConditionalGeneration, got {type(model).__name__}"
        )
    input_ids, attention_mask = example_inputs(model)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = model.config
    batch = torch.export.Dim("batch")
    source = torch.export.Dim("source", max=config.max_position_embeddings)
    encoder = Seq2SeqEncoderGraph(model)
    layers = len(model.get_decoder().layers)
    with torch.no_grad():
        cross = encoder(input_ids, attention_mask)
    step = DecoderStepGraph(model)
    state = initial_state(config, EXAMPLE_SHAPE[0])
    # the source axis: keys and values (B, H, M, D) third, the additive context (B, H, 1, D) none, the encoder's
    # output (B, M, hidden) second
    cross_dims = tuple(
        {0: batch, **({2: source} if tensor.shape[2] == input_ids.shape[1] else {})} for tensor in cross[: 2 * layers]
    )
    cross_dims += ({0: batch, 1: source},) * (len(cross) - 2 * layers)
    paths = {"encoder": folder / "encoder.onnx", "decoder_step": folder / "decoder_step.onnx"}
    positions = torch.zeros(EXAMPLE_SHAPE[0], dtype=torch.long)
    step_args = (input_ids[:, :1], positions, attention_mask, cross, tuple(state))
    step_dims = ({0: batch}, {0: batch}, {0: batch, 1: source}, cross_dims, ({0: batch},) * len(state))
    # an input the graph does not read is refused with a dynamic shape
    copies = getattr(model, "copy_head", None) is not None
    if copies:  # a tensor of its own: a view of another input would be traced as that one
        step_args, step_dims = step_args + (input_ids.clone(),), step_dims + ({0: batch, 1: source},)
    with using_attention_mode(model, exported_attention_mode(model)), torch.no_grad():
        programs = {
            "encoder": torch.export.export(
                encoder, (input_ids, attention_mask), dynamic_shapes=({0: batch, 1: source}, {0: batch, 1: source})
            ),
            "decoder_step": torch.export.export(step, step_args, dynamic_shapes=step_dims),
        }
    cross_names = [f"cross.{index}" for index in range(len(cross))]
    state_names = [f"state.{index}" for index in range(len(state))]
    step_inputs = ["input_ids", "positions", "encoder_attention_mask", *cross_names, *state_names]
    step_outputs = ["logits", "positions_out", *(f"state_out.{index}" for index in range(len(state)))]
    names = {
        "encoder": (["input_ids", "attention_mask"], cross_names),
        "decoder_step": (step_inputs + ["source_ids"] * copies, step_outputs),
    }
    for name, program in programs.items():
        inputs, outputs = names[name]
        torch.onnx.export(program, input_names=inputs, output_names=outputs, dynamo=True, verbose=False).save(
            str(paths[name])
        )
    return paths


# generation settings that change greedy search's choice of token (logits processors; the loop below has none) -> the
# values that leave it as it is
PROCESSOR_DEFAULTS = {
    **dict.fromkeys(("no_repeat_ngram_size", "encoder_no_repeat_ngram_size", "min_length"), (0, None)),
    **dict.fromkeys(("min_new_tokens", "bad_words_ids", "suppress_tokens", "begin_suppress_tokens"), (None,)),
    **dict.fromkeys(("forced_bos_token_id", "forced_eos_token_id"), (None,)),
    "repetition_penalty": (1.0, None),
}


def onnx_sessions(folder: str | Path, threads: int | None = None) -> tuple:
    """ONNX Runtime sessions of the graphs `export_seq2seq_onnx` wrote to `folder`: (encoder, decoding step)."""
    import onnxruntime  # noqa: PLC0415  (the [onnx] extra)

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return tuple(
        onnxruntime.InferenceSession(str(Path(folder) / name), options, providers=["CPUExecutionProvider"])
        for name in ("encoder.onnx", "decoder_step.onnx")
    )


def onnx_greedy_generate(
    sessions: tuple, config, input_ids, attention_mask, max_new_tokens: int, generation_config=None
):
    """Greedy decoding on ONNX Runtime with `sessions` (`onnx_sessions`): what `model.generate(input_ids,
    attention_mask=..., do_sample=False, num_beams=1, max_new_tokens=...)` returns, as numpy int64. The special tokens
    come from `generation_config` (default: `config`'s), which may set no logits processor (PROCESSOR_DEFAULTS)."""
    import numpy as np  # noqa: PLC0415
    from transformers import GenerationConfig  # noqa: PLC0415

    generation = generation_config or GenerationConfig.from_model_config(config)
    changed = {
        name: getattr(generation, name, None)
        for name, defaults in PROCESSOR_DEFAULTS.items()
        if getattr(generation, name, None) not in defaults
    }
    if changed:
        raise ValueError(f"onnx_greedy_generate is plain greedy search; the generation config also sets {changed}")
    start = (
        generation.decoder_start_token_id if generation.decoder_start_token_id is not None else generation.bos_token_id
    )
    ends = [] if generation.eos_token_id is None else list(np.atleast_1d(generation.eos_token_id))
    pad = generation.pad_token_id if generation.pad_token_id is not None else (ends[0] if ends else None)
    if start is None or (ends and pad is None):
        raise ValueError("Set decoder_start_token_id (or bos_token_id) and pad_token_id in the generation config")
    if max_new_tokens > config.max_position_embeddings:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} reaches past the decoder's {config.max_position_embeddings} positions"
        )
    encoder, step = sessions
    batch_size = input_ids.shape[0]
    cross = encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})
    read = {graph_input.name for graph_input in step.get_inputs()}  # the inputs the step's graph kept
    state = [tensor.numpy() for tensor in initial_state(config, batch_size)]
    tokens = np.full((batch_size, 1), start, np.int64)
    positions = np.zeros(batch_size, np.int64)
    finished = np.zeros(batch_size, bool)
    for _ in range(max_new_tokens):
        feeds = {
            "input_ids": tokens[:, -1:],
            "positions": positions,
            "encoder_attention_mask": attention_mask,
            **{f"cross.{index}": tensor for index, tensor in enumerate(cross)},
            **{f"state.{index}": tensor for index, tensor in enumerate(state)},
            "source_ids": input_ids,
        }
        logits, positions, *state = step.run(None, {name: value for name, value in feeds.items() if name in read})
        chosen = np.where(finished, pad if pad is not None else 0, logits.argmax(-1))
        tokens = np.concatenate([tokens, chosen[:, None]], axis=1)
        finished |= np.isin(chosen, ends)
        if finished.all():
            break
    return tokens


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model_name_or_path", required=True, help="A Fastformer encoder-decoder: folder or Hub id.")
    parser.add_argument("--output_dir", required=True, help="Where encoder.onnx and decoder_step.onnx are written.")
    args = parser.parse_args(argv)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path).eval()
    for name, path in export_seq2seq_onnx(model, args.output_dir).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
