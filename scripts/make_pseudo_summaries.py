"""Write pseudo-summaries of unlabeled text for pretraining a summarizer's decoder before the real targets
(PEGASUS' gap sentences, arXiv:1912.08777): each text's lead sentence (or its most salient one) becomes the
summary of the rest (`pseudo_summary`).

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
import re
from pathlib import Path

import numpy as np
from rouge_score import rouge_scorer

from headline_rules import clean_source

REPO = Path(__file__).resolve().parents[1]
# (file, the text's field)
TEXTS = [(REPO / "data/news_headlines/train.jsonl", "document")]
HELD_OUT = [(REPO / f"data/news_headlines/{split}.jsonl", "document") for split in ("validation", "test")]
PSEUDO_SUMMARY_MODES = ("lead", "salient")
SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]*[A-Z0-9])")


def text_key(text: str) -> str:
    """What identifies a text across copies (one cut shorter, other white space): its first 200 characters of words."""
    return " ".join(text.split())[:200].lower()


def pseudo_summary(
    text: str, mode: str = "lead", lead_words: int | None = 16, keep_gap: bool = False, summary_words: int | None = None
) -> dict | None:
    """A PEGASUS gap-sentence pair (arXiv:1912.08777) from unlabeled `text`: {"document": the text without the gap,
    "summary": the gap}. "lead": the first sentence; "salient": the sentence of highest ROUGE-1 F1 against the rest
    (PEGASUS' Ind-Orig). A text without sentence ends (e.g. lowercased, unpunctuated) gives its first `lead_words`
    words in either mode (None: no pair). `keep_gap`: the document is the whole text, so that the summary can be
    copied from it (PEGASUS' Ind-Orig keeps it in 20% of the pairs); `summary_words`: the summary is cut to its
    first words (headline length). None when one side would be empty."""
    if mode not in PSEUDO_SUMMARY_MODES:
        raise ValueError(f"mode must be one of {PSEUDO_SUMMARY_MODES}, got {mode!r}")
    sentences = [sentence for sentence in SENTENCE_END.split(" ".join(text.split())) if sentence]
    if len(sentences) < 2:
        if lead_words is None:
            return None
        words = text.split()
        sentences = [" ".join(words[:lead_words]), " ".join(words[lead_words:])]
        gap = 0
    elif mode == "lead":
        gap = 0
    else:
        scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
        rest = [" ".join(sentences[:index] + sentences[index + 1 :]) for index in range(len(sentences))]
        scores = [scorer.score(other, sentence)["rouge1"].fmeasure for sentence, other in zip(sentences, rest)]
        gap = int(np.argmax(scores))
    document = " ".join(sentences if keep_gap else sentences[:gap] + sentences[gap + 1 :])
    summary = " ".join(sentences[gap].split()[:summary_words])
    if not document or not summary:
        return None
    return {"document": document, "summary": summary}


def pseudo_summary_pairs(texts, held_out, mode: str = "lead", lead_words: int | None = 16, **options) -> list[dict]:
    """`pseudo_summary` (with `options`) of each of `texts` that is not among `held_out` (texts never to train on: a
    summarization data set's validation and test documents) and not a copy of an earlier one (`text_key`), in
    order."""
    seen = {text_key(text) for text in held_out}
    pairs = []
    for text in texts:
        key = text_key(text)
        if key in seen:
            continue
        seen.add(key)
        pair = pseudo_summary(text, mode, lead_words, **options)
        if pair is not None:
            pairs.append(pair)
    return pairs


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
