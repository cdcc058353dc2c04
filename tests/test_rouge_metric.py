"""scripts/rouge_metric.py: ROUGE through `evaluate`, loaded by its path with the Hub unreachable, gives the numbers of
rouge_score scored and aggregated directly (the Hub's "rouge" metric's way, its bootstrap seeded)."""

import os

import evaluate
import numpy as np
import pytest
from rouge_score import rouge_scorer, scoring

import rouge_metric

PREDICTIONS = ["the cat sat on the mat", "a dog", "floods hit kerala on monday", "", "Putin signs law on Russia's"]
REFERENCES = ["the cat sat", "dogs bark loudly", "Floods in Kerala kill two", "nothing here", "putin signs the law"]


def direct(predictions, references, use_stemmer=True):
    """rouge_score's scorer and bootstrap aggregator, numpy's generator seeded with 0 for the bootstrap."""
    scorer = rouge_scorer.RougeScorer(rouge_metric.ROUGE_TYPES, use_stemmer=use_stemmer)
    aggregator = scoring.BootstrapAggregator()
    for prediction, reference in zip(predictions, references):
        aggregator.add_scores(scorer.score(reference, prediction))
    np.random.seed(0)
    return {name: score.mid.fmeasure for name, score in aggregator.aggregate().items()}


def test_the_metric_loads_offline_by_its_path_and_gives_rouge_scores_numbers():
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"  # conftest: no Hub
    metric = evaluate.load(rouge_metric.__file__, keep_in_memory=True)
    for use_stemmer in (True, False):
        found = metric.compute(predictions=PREDICTIONS, references=REFERENCES, use_stemmer=use_stemmer)
        assert found == direct(PREDICTIONS, REFERENCES, use_stemmer)
    assert rouge_metric.rouge(PREDICTIONS, REFERENCES) == {
        name: 100 * value for name, value in direct(PREDICTIONS, REFERENCES).items()
    }
    # per example, the types asked for: rouge_score's F-measures
    each = metric.compute(
        predictions=PREDICTIONS, references=REFERENCES, rouge_types=["rouge2"], use_aggregator=False, use_stemmer=True
    )
    scorer = rouge_scorer.RougeScorer(["rouge2"], use_stemmer=True)
    assert each == {"rouge2": [scorer.score(r, p)["rouge2"].fmeasure for p, r in zip(PREDICTIONS, REFERENCES)]}


def test_rouge_is_deterministic_and_leaves_numpy_random_state_alone():
    predictions, references = ["the cat sat on the mat", "a dog"], ["the cat sat", "dogs bark loudly"]
    state = np.random.get_state()
    first = rouge_metric.rouge(predictions, references)
    assert np.random.get_state()[1].tolist() == state[1].tolist()
    assert rouge_metric.rouge(predictions, references) == first
    # unigram F1: 2/3 for the first pair (precision 3/6, recall 3/3), 0.4 for the second ("dogs" stems to "dog")
    assert first["rouge1"] == pytest.approx(100 * (2 / 3 + 0.4) / 2)
