"""Write the compact data subsets bundled in data/ from the full copies in ../shared/data.

- 20newsgroups/{train,test}.jsonl: 120 / 30 documents per class (all 20 classes), text cut to 3000 characters;
- news_headlines/{train,validation,test}.jsonl: the whole split (2924 / 365 / 366 articles), in the source's order,
  each document cut to what the longest source length used (2048 tokens of the bundled bert-base-uncased
  tokenizer, [CLS] and [SEP] included) reads;
- 20newsgroups_fewshot/train.jsonl: 10 documents per class from the training documents not in the subset above
  (a second, few-shot training split; test with 20newsgroups/test.jsonl);
- distillation/train.jsonl.gz: unlabeled text for the attention transfer of a converted model: 4000 training
  documents of 20 Newsgroups in none of the files above and every training article of news_headlines (never
  a validation or test article), cut to 1500 characters, shuffled.

Texts are cut at a word boundary; rows left empty are skipped. The same seed gives the same bytes.
Usage: python scripts/make_data_subsets.py --shared-data ../shared/data [--output data] [--seed 0]
"""

import argparse
import gzip
import json
import random
import re
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer

NEWSGROUPS_PER_CLASS = {"train": 120, "test": 30}
NEWSGROUPS_MAX_CHARS = 3000
HEADLINES_SPLITS = ("train", "validation", "test")
HEADLINES_MAX_TOKENS = 2048  # the longest --max_source_length of docs/RESULTS.md's summarization table
TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "tokenizers" / "bert-base-uncased"
FEWSHOT_PER_CLASS = 10
DISTILLATION_NEWSGROUPS = 4000
DISTILLATION_MAX_CHARS = 1500


def truncate_at_word(text, max_chars):
    """Cut `text` to at most `max_chars` characters without splitting a word."""
    if len(text) <= max_chars:
        return text
    # One character past the limit shows whether the last word ends exactly at max_chars.
    head = text[: max_chars + 1]
    return re.sub(r"\S*$", "", head).rstrip()


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")
    # gzip without a timestamp, so the same rows give the same bytes
    path.write_bytes(gzip.compress(text, mtime=0) if path.suffix == ".gz" else text)
    print(f"{path}: {len(rows)} rows")


def sample(rows, k, rng, what):
    if len(rows) < k:
        raise SystemExit(f"{what}: asked for {k} rows, only {len(rows)} available")
    return rng.sample(rows, k)


def newsgroups_subset(path, per_class, seed):
    by_label = defaultdict(list)
    for row in read_jsonl(path):
        text = truncate_at_word(row["text"], NEWSGROUPS_MAX_CHARS)
        if text.strip():
            by_label[row["label"]].append({"text": text, "label": row["label"]})
    rng = random.Random(seed)
    rows = []
    for label in sorted(by_label):
        rows += sample(by_label[label], per_class, rng, f"{path} class {label!r}")
    rng.shuffle(rows)
    return rows


def truncate_at_tokens(text, tokenizer, max_tokens):
    """`text` cut, without splitting a word, to the words that `max_tokens` tokens (special tokens included) read."""
    encoded = tokenizer(text, max_length=max_tokens, truncation=True, return_offsets_mapping=True)
    if len(encoded["input_ids"]) < max_tokens:
        return text
    end = max(stop for _, stop in encoded["offset_mapping"])  # special tokens have (0, 0)
    return truncate_at_word(text, end)


def headlines_split(path, tokenizer):
    """Every article of `path`, in order, cut to HEADLINES_MAX_TOKENS tokens; the `subtitle` field is dropped."""
    rows = []
    for row in read_jsonl(path):
        document = truncate_at_tokens(row["document"], tokenizer, HEADLINES_MAX_TOKENS)
        if document.strip() and row["summary"].strip():
            rows.append({"id": row["id"], "document": document, "summary": row["summary"]})
    return rows


def unused_newsgroups(path, used_texts, max_chars):
    """The training documents of `path` whose (cut) text is in none of `used_texts`, cut to `max_chars`."""
    rows = []
    for row in read_jsonl(path):
        text = truncate_at_word(row["text"], NEWSGROUPS_MAX_CHARS)
        if text.strip() and text not in used_texts:
            rows.append({"text": truncate_at_word(row["text"], max_chars), "label": row["label"]})
    return rows


def fewshot_subset(rows, per_class, seed):
    by_label = defaultdict(list)
    for row in rows:
        by_label[row["label"]].append(row)
    rng = random.Random(seed)
    chosen = [row for label in sorted(by_label) for row in sample(by_label[label], per_class, rng, label)]
    rng.shuffle(chosen)
    return chosen


def distillation_texts(newsgroups, headlines_path, seed):
    rng = random.Random(seed)
    texts = [row["text"] for row in sample(newsgroups, DISTILLATION_NEWSGROUPS, rng, "20newsgroups for distillation")]
    for row in read_jsonl(headlines_path):
        document = truncate_at_word(row["document"], DISTILLATION_MAX_CHARS)
        if document.strip():
            texts.append(document)
    rng.shuffle(texts)
    return [{"text": text} for text in texts]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--shared-data", type=Path, required=True, help="folder holding 20newsgroups/ and news_headlines/"
    )
    parser.add_argument("--output", type=Path, default=Path("data"), help="where to write the subsets (default: data)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling and shuffling (default: 0)")
    args = parser.parse_args()

    for split, per_class in NEWSGROUPS_PER_CLASS.items():
        rows = newsgroups_subset(args.shared_data / "20newsgroups" / f"{split}.jsonl", per_class, args.seed)
        write_jsonl(args.output / "20newsgroups" / f"{split}.jsonl", rows)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    for split in HEADLINES_SPLITS:
        rows = headlines_split(args.shared_data / "news_headlines" / f"{split}.jsonl", tokenizer)
        write_jsonl(args.output / "news_headlines" / f"{split}.jsonl", rows)

    subset = {row["text"] for row in read_jsonl(args.output / "20newsgroups" / "train.jsonl")}
    unused = unused_newsgroups(args.shared_data / "20newsgroups" / "train.jsonl", subset, NEWSGROUPS_MAX_CHARS)
    fewshot = fewshot_subset(unused, FEWSHOT_PER_CLASS, args.seed)
    write_jsonl(args.output / "20newsgroups_fewshot" / "train.jsonl", fewshot)
    taken = subset | {row["text"] for row in fewshot}
    rest = [
        {"text": truncate_at_word(row["text"], DISTILLATION_MAX_CHARS)} for row in unused if row["text"] not in taken
    ]
    headlines = args.shared_data / "news_headlines" / "train.jsonl"
    write_jsonl(args.output / "distillation" / "train.jsonl.gz", distillation_texts(rest, headlines, args.seed))


if __name__ == "__main__":
    main()
