"""Write pseudo-summaries of unlabeled text for pretraining a summarizer's decoder before the real targets
(PEGASUS' gap sentences, arXiv:1912.08777): each text's lead sentence (or its most salient one) becomes the
summary of the rest (fastformer.summarization.pseudo_summary).

By default from the bundled news training articles, never a validation or test article (those are held out by
content); other texts with --texts (the bundled data/distillation/train.jsonl.gz:text adds lowercased 20 Newsgroups
documents). The output is a JSON-lines file of {"document", "summary"} that run_summarization.py trains on:

    python scripts/make_pseudo_summaries.py --output runs/pseudo_summaries/lead.jsonl
    python scripts/run_summarization.py --train_file runs/pseudo_summaries/lead.jsonl ...

--keep_gap --summary_words 12 --clean_sources: the article whole (without its dateline) -> its lead cut to 12
words, a pair the decoder can learn to copy from.
"""

import argparse
import gzip
import json
from pathlib import Path

from fastformer.summarization import PSEUDO_SUMMARY_MODES, clean_source, pseudo_summary_pairs

REPO = Path(__file__).resolve().parents[1]
# (file, the text's field)
TEXTS = [(REPO / "data/news_headlines/train.jsonl", "document")]
HELD_OUT = [(REPO / f"data/news_headlines/{split}.jsonl", "document") for split in ("validation", "test")]


def read_texts(path: Path, field: str) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as file:
        rows = [json.loads(line) for line in file if line.strip()]
    if rows and field not in rows[0]:
        raise SystemExit(f"{Path(__file__).name}: error: {path} has no field {field!r} (it has {sorted(rows[0])})")
    return [row[field] for row in rows]


def file_and_field(value: str) -> tuple[Path, str]:
    path, _, field = value.partition(":")
    return Path(path), field or "text"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", type=Path, required=True, help="the JSON-lines file to write")
    parser.add_argument("--mode", choices=PSEUDO_SUMMARY_MODES, default="lead")
    parser.add_argument(
        "--texts",
        type=file_and_field,
        nargs="+",
        default=TEXTS,
        help="FILE:FIELD, JSON lines (.gz too) (default: the bundled news training articles)",
    )
    parser.add_argument(
        "--held_out",
        type=file_and_field,
        nargs="+",
        default=HELD_OUT,
        help="FILE:FIELD of texts never to use (default: the news validation and test articles)",
    )
    parser.add_argument(
        "--lead_words", type=int, default=16, help="the summary of a text without sentence ends (0: no pair)"
    )
    switch = dict(type=lambda value: value.lower() in ("true", "1", "yes"), nargs="?", const=True, default=False)
    parser.add_argument("--keep_gap", **switch, help="the document keeps the sentence taken as summary")
    parser.add_argument("--summary_words", type=int, default=None, help="cut each summary to its first N words")
    parser.add_argument("--clean_sources", **switch, help="strip datelines and share bars first")
    parser.add_argument("--max_texts", type=int, default=None, help="use only the first N texts")
    args = parser.parse_args(argv)
    texts = [text for path, field in args.texts for text in read_texts(path, field)][: args.max_texts]
    if args.clean_sources:
        texts = [clean_source(text) for text in texts]
    held_out = [text for path, field in args.held_out for text in read_texts(path, field)]
    options = {"keep_gap": args.keep_gap, "summary_words": args.summary_words}
    pairs = pseudo_summary_pairs(texts, held_out, args.mode, args.lead_words or None, **options)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(pair, ensure_ascii=False) + "\n" for pair in pairs), encoding="utf-8")
    print(f"{len(pairs)} pairs from {len(texts)} texts ({args.mode}) -> {args.output}")


if __name__ == "__main__":
    main()
