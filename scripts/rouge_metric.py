"""ROUGE as the headline recipe reports it (scripts/run_summarization.py, benchmarks/quality): rouge_score's
F-measures, aggregated as the `evaluate` rouge metric does, offline."""

import functools

import numpy as np
from rouge_score import rouge_scorer, scoring

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


@functools.cache
def cached_rouge_scorer():
    """rouge_score's scorer of `ROUGE_TYPES`, with its Porter stemmer, as the `evaluate` rouge metric builds it."""
    return rouge_scorer.RougeScorer(ROUGE_TYPES, use_stemmer=True)


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE F-measures x 100, aggregated as the `evaluate` rouge metric does, without the Hub; the bootstrap
    resampling is seeded, so the same texts always give the same numbers."""
    scorer = cached_rouge_scorer()
    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references):
        aggregator.add_scores(scorer.score(reference, prediction))
    state = np.random.get_state()  # the aggregator draws from numpy's global generator: leave it as it was
    np.random.seed(0)
    try:
        aggregated = aggregator.aggregate()
    finally:
        np.random.set_state(state)
    return {name: 100 * score.mid.fmeasure for name, score in aggregated.items()}
