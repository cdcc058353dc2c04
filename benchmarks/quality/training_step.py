"""What one summarization training step costs with the encoder frozen: end to end (the encoder runs in every step)
against `CachedEncoderStates` (its output computed once per article, then only the decoder runs), by source
length, beside the encoder pass alone. MiniLM-size models (hidden 384, 6 + 6 layers, 12 heads, feed-forward 1536,
vocabulary 30,522): the Fastformer encoder-decoder and BERT2BERT (transformers' EncoderDecoderModel of two BERTs,
SDPA attention, 512 positions: its rows stop there), random weights, fp32, AdamW over the trainable parameters;
seconds per step (forward, backward, optimizer step), median over --repeats after a warm-up step.

    python -m benchmarks.quality.training_step                 # sources 64 512 1024 2048, batch 16
    python -m benchmarks.quality.training_step --report        # docs/TRAINING_STEP.md from docs/training_step.json
"""

import statistics
import time
from pathlib import Path

import torch
from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

from benchmarks.harness import DOCS, arguments, random_ids, read_json, run_lines, table, write_doc, write_json
from fastformer import FastformerConfig, FastformerForConditionalGeneration
from fastformer.summarization import freeze_encoder

MODES = {
    "end_to_end": "end to end",
    "cached": "cached encoder states",
    "cached_fixed_kv": "cached states, cross-attention key/value fixed",
    "encoder": "the encoder pass alone",
}


def parse_args(argv=None):
    parser = arguments(__doc__, threads=2, repeats=3, report="only rewrite the report from its record")
    parser.add_argument("--sources", type=int, nargs="+", default=[64, 512, 1024, 2048], help="source tokens")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--target-length", type=int, default=16)
    parser.add_argument("--cross-attention", choices=["softmax", "additive"], default="softmax")
    parser.add_argument("--size", default="hidden_size=384,num_hidden_layers=6,num_attention_heads=12,"
                        "intermediate_size=1536", help="config fields, as --config_overrides")  # fmt: skip
    parser.add_argument("--docs", type=Path, default=DOCS, help="where training_step.json and TRAINING_STEP.md go")
    return parser.parse_args(argv)


BERT_POSITIONS = 512


def build(args) -> dict[str, torch.nn.Module]:
    """Both models, the encoder frozen as the recipe's --freeze_encoder, in training mode."""
    size = {key: int(value) for key, value in (item.split("=") for item in args.size.split(","))}
    special = dict(pad_token_id=0, decoder_start_token_id=101, eos_token_id=102)
    fastformer = FastformerConfig(
        **size, share_layers=False, query_residual=False, max_position_embeddings=max(args.sources),
        cross_attention_type=args.cross_attention, **special,
    )  # fmt: skip
    bert = dict(**size, max_position_embeddings=BERT_POSITIONS, attn_implementation="sdpa")
    bert2bert = EncoderDecoderConfig.from_encoder_decoder_configs(
        BertConfig(**bert), BertConfig(**bert, is_decoder=True, add_cross_attention=True)
    )
    bert2bert.update(special)
    torch.manual_seed(0)
    models = {"Fastformer": FastformerForConditionalGeneration(fastformer), "BERT2BERT": EncoderDecoderModel(bert2bert)}
    for model in models.values():
        freeze_encoder(model)
        model.train()
    return models


def cross_key_values(model) -> list[torch.nn.Parameter]:
    """The cross-attention's key and value projections of every decoder layer."""
    if isinstance(model, EncoderDecoderModel):
        attentions = [layer.crossattention.self for layer in model.decoder.bert.encoder.layer]
    else:
        attentions = [layer.cross_attention for layer in model.get_decoder().layers]
    return [p for attention in attentions for name in ("key", "value") for p in getattr(attention, name).parameters()]


def median_seconds(call, repeats: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(model, args, source_length: int) -> dict[str, float]:
    vocab = model.get_input_embeddings().num_embeddings
    inputs = {"input_ids": random_ids(args.batch_size * source_length, vocab).view(args.batch_size, -1),
              "attention_mask": torch.ones(args.batch_size, source_length, dtype=torch.long),
              "labels": random_ids(args.batch_size * args.target_length, vocab).view(args.batch_size, -1)}  # fmt: skip
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    encoder = model.get_encoder()

    def encode():
        with torch.no_grad():
            return encoder(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])

    def step(batch):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    cached = {**{k: v for k, v in inputs.items() if k != "input_ids"}, "encoder_outputs": encode()}
    seconds = {"end_to_end": median_seconds(lambda: step(inputs), args.repeats),
               "cached": median_seconds(lambda: step(cached), args.repeats),
               "encoder": median_seconds(encode, args.repeats)}  # fmt: skip
    fixed = cross_key_values(model)  # no gradient for them: their backward and optimizer update are left out
    for parameter in fixed:
        parameter.requires_grad_(False)
    seconds["cached_fixed_kv"] = median_seconds(lambda: step(cached), args.repeats)
    for parameter in fixed:
        parameter.requires_grad_(True)
    return seconds


def report(record) -> list[str]:
    settings = record["settings"]
    rows = [[name, length, *(f"{seconds[mode]:.3f}" if mode in seconds else "-" for mode in MODES),
             f"{seconds['end_to_end'] / seconds['cached']:.2f}"]
            for name, lengths in record["seconds"].items() for length, seconds in lengths.items()]  # fmt: skip
    return [
        "# A summarization training step with the encoder frozen: end to end or from cached encoder states",
        "",
        *record["header"],
        f"- Models ({settings['size']}): a Fastformer encoder-decoder (no layer sharing, "
        f"{settings['cross_attention']} cross-attention) and BERT2BERT (EncoderDecoderModel of two BERTs, SDPA, "
        f"{BERT_POSITIONS} positions), random weights, fp32; batch {settings['batch_size']}, "
        f"{settings['target_length']}-token targets; the encoder frozen (freeze_encoder); AdamW over the trainable "
        f"parameters. Seconds per step (forward, backward, optimizer step), median of {settings['repeats']} after a "
        "warm-up.",
        "",
        *table(["model", "source tokens", *(f"{name}, s" for name in MODES.values()), "end to end / cached"], rows),
    ]


def main(argv=None):
    args = parse_args(argv)
    if not args.report:
        torch.set_num_threads(args.threads)
        start = time.perf_counter()
        models = build(args)
        seconds = {name: {str(length): measure(model, args, length) for length in args.sources
                          if name == "Fastformer" or length <= BERT_POSITIONS}
                   for name, model in models.items()}  # fmt: skip
        settings = {name: getattr(args, name) for name in ("size", "batch_size", "target_length", "cross_attention",
                                                           "repeats")}  # fmt: skip
        write_json(args.docs / "training_step.json", {"header": run_lines(args.threads, time.perf_counter() - start),
                                                      "settings": settings, "seconds": seconds})  # fmt: skip
    print(write_doc(args.docs / "TRAINING_STEP.md", report(read_json(args.docs / "training_step.json"))))


if __name__ == "__main__":
    main()
