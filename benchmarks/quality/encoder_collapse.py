"""Why the summarization recipe freezes the encoder (docs/RESULTS.md): the converted Fastformer and BERT2BERT, the
encoder fine-tuned or frozen, train --steps steps on the training headlines (batch 16, source 256, bf16 autocast);
every 20 steps, on 32 validation articles: the encoder's spread (scripts/frozen_encoder.py's token_state_spread),
the loss with each article's headline and with another article's (equal losses: the decoder does not use the article).
"""

import itertools
import json
import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from benchmarks.harness import DOCS, REPO, arguments, minilm, rows_table, write_record
from benchmarks.quality.summarization import BERT2BERT_DROPOUT
from scripts.bert2bert import bert2bert_model
from scripts.frozen_encoder import freeze_encoder, token_state_spread


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--converted", required=True, help="convert_bert_to_fastformer.py --task seq2seq")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--output", type=Path, default=DOCS / "encoder_collapse.json")
    return parser.parse_args(argv)


def batch(tokenizer, rows: list[dict]) -> dict:
    inputs = tokenizer([row["document"] for row in rows], max_length=256, truncation=True, padding=True)
    targets = tokenizer([row["summary"] for row in rows], add_special_tokens=False, max_length=31, truncation=True)
    targets = [ids + [tokenizer.sep_token_id] for ids in targets["input_ids"]]
    labels = [ids + [-100] * (max(map(len, targets)) - len(ids)) for ids in targets]
    inputs = {key: torch.tensor(inputs[key]) for key in ("input_ids", "attention_mask")}
    return {**inputs, "labels": torch.tensor(labels)}


@torch.no_grad()
def measure(model, inputs: dict) -> dict:
    other = {**inputs, "labels": inputs["labels"].roll(1, dims=0)}  # each article with another one's headline
    found = {"spread": token_state_spread(model.eval().get_encoder(), **inputs), "loss": model(**inputs).loss.item()}
    return {**found, "loss_other_article": model(**other).loss.item()}


def curve(model, args, tokenizer, train: list[dict], held_out: dict) -> list[dict]:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    points, start = [{"step": 0, **measure(model, held_out)}], time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = [train[index % len(train)] for index in range((step - 1) * 16, step * 16)]  # epochs after the first
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.train()(**batch(tokenizer, rows)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0 or step == args.steps:
            points.append({"step": step, **measure(model, held_out), "seconds": time.perf_counter() - start})
    return points


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(args.converted)
    data = REPO / "data" / "news_headlines"
    train = [json.loads(line) for line in (data / "train.jsonl").open()]
    held_out = batch(tokenizer, [json.loads(line) for line in (data / "validation.jsonl").open()][:32])
    rows = []
    for name, frozen in itertools.product(("fastformer", "bert2bert"), (False, True)):
        torch.manual_seed(0)
        fastformer = name == "fastformer"
        bert2bert = None if fastformer else bert2bert_model(args.source or minilm(), **BERT2BERT_DROPOUT)[0]
        model = bert2bert or AutoModelForSeq2SeqLM.from_pretrained(args.converted)
        if frozen:
            freeze_encoder(model)
        label = f"{name}, encoder {'frozen' if frozen else 'fine-tuned'}"
        rows += [{"model": label, **point} for point in curve(model, args, tokenizer, train, held_out)]
    write_record(args.output, rows, args)
    print(rows_table(rows))


if __name__ == "__main__":
    main()
