"""What a summarization training step with the encoder frozen costs (docs/TRAINING_STEP.md), by source length: the
median seconds of --repeats after a warm-up, end to end, from cached encoder states, from cached states with the
cross-attention's key and value projections fixed, and of the encoder pass alone. Fastformer and BERT2BERT (512
positions: its rows stop there), MiniLM's size, random weights, fp32, AdamW.
"""

import re
import statistics
import timeit
from pathlib import Path

import torch
from transformers import BertConfig, EncoderDecoderConfig, EncoderDecoderModel

from benchmarks.harness import DOCS, arguments, random_ids, rows_table, write_record
from fastformer import FastformerConfig, FastformerForConditionalGeneration
from scripts.frozen_encoder import freeze_encoder

MINILM = "hidden_size=384,num_hidden_layers=6,num_attention_heads=12,intermediate_size=1536"
CROSS_KEY_VALUE = re.compile(r"(crossattention\.self|cross_attention)\.(key|value)\.")  # BERT2BERT's, Fastformer's


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--sources", type=int, nargs="+", default=[64, 512, 1024, 2048], help="source tokens")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--target-length", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cross-attention", choices=["softmax", "additive"], default="softmax")
    parser.add_argument("--size", default=MINILM, help="config fields, as --config_overrides")
    parser.add_argument("--output", type=Path, default=DOCS / "training_step.json")
    return parser.parse_args(argv)


def build(args) -> dict[str, torch.nn.Module]:
    """Both models, the encoder frozen as the recipe's --freeze_encoder does (its word embeddings too)."""
    size = {key: int(value) for key, value in (item.split("=") for item in args.size.split(","))}
    special = dict(pad_token_id=0, decoder_start_token_id=101, eos_token_id=102)
    fastformer = dict(share_layers=False, query_residual=False, cross_attention_type=args.cross_attention)
    fastformer = FastformerConfig(**size, **fastformer, **special, max_position_embeddings=max(args.sources))
    bert = dict(**size, max_position_embeddings=512, attn_implementation="sdpa")
    decoder = BertConfig(**bert, is_decoder=True, add_cross_attention=True)
    bert2bert = EncoderDecoderConfig.from_encoder_decoder_configs(BertConfig(**bert), decoder, **special)
    torch.manual_seed(0)
    models = {"Fastformer": FastformerForConditionalGeneration(fastformer), "BERT2BERT": EncoderDecoderModel(bert2bert)}
    for model in models.values():
        freeze_encoder(model)
    return models


def median_seconds(call, repeats: int) -> float:
    call()  # warm-up
    return statistics.median(timeit.repeat(call, number=1, repeat=repeats))


def measure(model, args, length: int) -> dict[str, float]:
    vocab = model.get_input_embeddings().num_embeddings
    ids = random_ids(args.batch_size * length, vocab).view(args.batch_size, -1)
    labels = random_ids(args.batch_size * args.target_length, vocab).view(args.batch_size, -1)
    encoder, optimizer = model.get_encoder(), torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])

    @torch.no_grad()
    def encode():
        return encoder(input_ids=ids, attention_mask=torch.ones_like(ids))

    def step(**batch):
        model(**batch, attention_mask=torch.ones_like(ids), labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    states = encode()
    seconds = {"end_to_end": median_seconds(lambda: step(input_ids=ids), args.repeats)}
    seconds["cached"] = median_seconds(lambda: step(encoder_outputs=states), args.repeats)
    fixed = [parameter for name, parameter in model.named_parameters() if CROSS_KEY_VALUE.search(name)]
    for parameter in fixed:
        parameter.requires_grad_(False)
    seconds["cached_fixed_kv"] = median_seconds(lambda: step(encoder_outputs=states), args.repeats)
    for parameter in fixed:
        parameter.requires_grad_(True)
    return {**seconds, "encoder": median_seconds(encode, args.repeats)}


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    for name, model in build(args).items():
        for length in args.sources if name == "Fastformer" else [n for n in args.sources if n <= 512]:
            seconds = measure(model.train(), args, length)
            ratio = seconds["end_to_end"] / seconds["cached"]
            rows.append({"model": name, "source_tokens": length, **seconds, "end_to_end / cached": ratio})
    write_record(args.output, rows, args)
    print(rows_table(rows))


if __name__ == "__main__":
    main()
