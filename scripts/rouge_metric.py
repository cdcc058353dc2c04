"""ROUGE (Lin, 2004) as an `evaluate` metric that needs no Hub: rouge_score's F-measures, aggregated as the Hub's
"rouge" metric aggregates them (the middle of a bootstrap of the per-text scores), with the bootstrap seeded so that
the same texts always give the same numbers. `evaluate.load("rouge")` fetches the Hub's metric; this one is loaded
by its path, offline too (`rouge()` does so):

    metric = evaluate.load("scripts/rouge_metric.py", keep_in_memory=True)
    metric.compute(predictions=["cats sat"], references=["the cat sat"], use_stemmer=True)  # 0 to 1

`rouge()` gives the aggregated F-measures x 100, as scripts/run_summarization.py reports them."""

import functools

import datasets
import evaluate
import numpy as np
from rouge_score import rouge_scorer, scoring

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


class RougeMetric(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=__doc__,
            citation="Lin, ROUGE: A Package for Automatic Evaluation of Summaries, ACL Workshop 2004",
            inputs_description="predictions and references: one text each per example; rouge_types (default: "
            f"{ROUGE_TYPES}); use_aggregator: the bootstrap's middle F-measure (else each example's); use_stemmer: "
            "Porter-stem words of 4 characters or more; seed: the bootstrap's",
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
            reference_urls=["https://github.com/google-research/google-research/tree/master/rouge"],
        )

    def _compute(self, predictions, references, rouge_types=None, use_aggregator=True, use_stemmer=False, seed=0):
        scorer = rouge_scorer.RougeScorer(rouge_types or ROUGE_TYPES, use_stemmer=use_stemmer)
        scores = [scorer.score(reference, prediction) for prediction, reference in zip(predictions, references)]
        if not use_aggregator:
            return {name: [score[name].fmeasure for score in scores] for name in scorer.rouge_types}
        aggregator = scoring.BootstrapAggregator()
        for score in scores:
            aggregator.add_scores(score)
        state = np.random.get_state()  # the aggregator draws from numpy's global generator: leave it as it was
        np.random.seed(seed)
        try:
            return {name: score.mid.fmeasure for name, score in aggregator.aggregate().items()}
        finally:
            np.random.set_state(state)


@functools.cache
def load() -> evaluate.EvaluationModule:
    """This file's metric through `evaluate.load`, once per process (in memory: no cache files)."""
    return evaluate.load(__file__, keep_in_memory=True)


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE-1, -2, -L and -Lsum F-measures x 100 of `predictions` against `references`, words stemmed."""
    scores = load().compute(predictions=predictions, references=references, use_stemmer=True)
    return {name: 100 * value for name, value in scores.items()}
