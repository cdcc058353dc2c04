"""Why the summarization recipe freezes the encoder: fine-tuning an encoder-decoder warm-started from an encoder
checkpoint, the gradient that reaches the encoder through the new, random cross-attention makes all its token
states alike within a few dozen steps, and the decoder then ignores the article.

For each model (the converted Fastformer and BERT2BERT from the same MiniLM checkpoint) and each setting (encoder
fine-tuned or frozen), it trains STEPS steps on the bundled training headlines (batch 16, source 256, AdamW, bf16
autocast as the recipe) and reports, on 32 validation articles, every 20 steps:
- spread: how much the encoder's last-layer states differ across the first 50 positions (mean over features of
  the standard deviation across positions; 0 = every token alike);
- the loss with each article's own headline, and with the headline of another article (the batch rolled by one):
  equal losses mean the decoder does not use the article.

    python -m benchmarks.quality.encoder_collapse --converted runs/minilm-fastformer-seq2seq
"""

import time
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

import fastformer  # noqa: F401  (registers Fastformer with the Auto classes)
from benchmarks.harness import DOCS, REPO, arguments, read_jsonl, table, write_json
from benchmarks.quality.summarization import bert2bert_model  # the BERT2BERT row's model
from fastformer.summarization import freeze_encoder  # what the recipe's --freeze_encoder does

DATA = REPO / "data" / "news_headlines"


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--converted", type=Path, required=True, help="convert_bert_to_fastformer.py --task seq2seq")
    parser.add_argument("--source", default=None, help="the BERT checkpoint BERT2BERT starts from (default: MiniLM)")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--learning-rate", type=float, default=3e-4)
    parser.add_argument("--output", type=Path, default=DOCS / "encoder_collapse.json")
    return parser.parse_args(argv)


def load(name: str, args):
    if name == "fastformer":
        return AutoModelForSeq2SeqLM.from_pretrained(args.converted)
    return bert2bert_model(args.source)[0]


def batch(tokenizer, rows):
    inputs = tokenizer([row["document"] for row in rows], max_length=256, truncation=True, padding=True,
                       return_tensors="pt", return_token_type_ids=False)  # fmt: skip
    targets = tokenizer(text_target=[row["summary"] for row in rows], add_special_tokens=False, max_length=31,
                        truncation=True)["input_ids"]  # fmt: skip
    targets = [ids + [tokenizer.sep_token_id] for ids in targets]
    longest = max(map(len, targets))
    inputs["labels"] = torch.tensor([ids + [-100] * (longest - len(ids)) for ids in targets])
    return inputs


@torch.no_grad()
def measure(model, inputs) -> dict:
    model.eval()
    states = model.get_encoder()(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    spread = states.last_hidden_state[:, :50].std(dim=1).mean().item()
    own = model(**inputs).loss.item()
    rolled = torch.roll(torch.arange(len(inputs["input_ids"])), 1)
    other = model(input_ids=inputs["input_ids"][rolled], attention_mask=inputs["attention_mask"][rolled],
                  labels=inputs["labels"]).loss.item()  # fmt: skip
    model.train()
    return {"spread": spread, "loss": own, "loss_other_article": other}


def run(name: str, frozen: bool, args, tokenizer, train, validation) -> list[dict]:
    torch.manual_seed(0)
    model = load(name, args)
    if frozen:
        freeze_encoder(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    held_out = batch(tokenizer, validation)
    curve = [{"step": 0, **measure(model, held_out)}]
    print(name, "frozen" if frozen else "fine-tuned", curve[-1], flush=True)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = [train[index % len(train)] for index in range((step - 1) * 16, step * 16)]  # epochs after the first
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**batch(tokenizer, rows)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            curve.append({"step": step, **measure(model, held_out), "seconds": time.perf_counter() - start})
            print(name, "frozen" if frozen else "fine-tuned", curve[-1], flush=True)
    return curve


def main():
    args = parse_args()
    tokenizer = AutoTokenizer.from_pretrained(args.converted)
    train, validation = read_jsonl(DATA / "train.jsonl"), read_jsonl(DATA / "validation.jsonl")[:32]
    results = {
        f"{name}, encoder {'frozen' if frozen else 'fine-tuned'}": run(name, frozen, args, tokenizer, train, validation)
        for name in ("fastformer", "bert2bert")
        for frozen in (False, True)
    }
    write_json(args.output, {"learning_rate": args.learning_rate, "curves": results})
    rows = [[label, point["step"], f"{point['spread']:.4f}", f"{point['loss']:.3f}",
             f"{point['loss_other_article']:.3f}"] for label, curve in results.items() for point in curve]  # fmt: skip
    print("\n".join(table(["model", "step", "spread", "loss", "loss, another article's headline"], rows)))


if __name__ == "__main__":
    main()
