"""Choosing a summary among the beams of generate(): a linear reranker, fit on a validation split.

Beam search keeps `num_beams` candidates and returns the one with the highest score. A `BeamReranker` scores each
candidate from what generate() and the article tell about it (its beam rank and score, its length, how many of the
article's salient words it holds: `FEATURES`) with weights fit by least squares to the candidates' ROUGE against the
references of a validation split, and chooses the candidate with the highest prediction among those `allowed`
(run_summarization.py: the top beam and the beams that copy one span of the article up to a clause's end,
`SourceSpanLogitsProcessor.copied_to_clause_end`). The weights, with the decoding settings they were fit under, are a
small JSON file beside the model (`save` / `load`).

    reranker = BeamReranker.fit([candidate_features(...) for each article], [candidate_targets(...) for each article])
    choice = reranker.choose(candidate_features(texts, scores, article), allowed)
"""

import json
from pathlib import Path

import numpy as np

import rouge_metric
from headline_rules import headline_words, is_content_word, keyword_headline, word_stem

FEATURES = (
    "rank",  # 0 for the top beam
    "score",  # generate()'s sequence score: the sum of its processed log probabilities over length ** length_penalty
    "score_minus_top",
    "words",  # as ROUGE counts them (`headline_words`)
    "words_minus_top",
    "keywords_held",  # how many of the keyword baseline's words (`keyword_headline`) of the article it holds
    "keywords_share",  # those over its words
)
KEYWORDS = 10  # the keyword baseline's k on the bundled headlines' validation split


def candidate_features(texts: list[str], scores, article: str, keywords: int = KEYWORDS) -> np.ndarray:
    """One article's candidates as a (candidates, len(FEATURES)) array: `texts` (as they will be written, the top
    beam first) and their sequence `scores` from generate(); `article` is the source the keywords are read from."""
    if len(texts) != len(scores) or not texts:
        raise ValueError(f"need one score per candidate text, got {len(texts)} texts and {len(scores)} scores")
    salient = {word_stem(word) for word in keyword_headline(article, keywords).split()}
    rows = []
    for rank, (text, score) in enumerate(zip(texts, scores)):
        words = headline_words(text)
        held = len({word_stem(word) for word in words if is_content_word(word)} & salient)
        rows.append([rank, float(score), 0.0, len(words), 0.0, held, held / max(len(words), 1)])
    features = np.array(rows, dtype=np.float64)
    features[:, 2] = features[:, 1] - features[0, 1]
    features[:, 4] = features[:, 3] - features[0, 3]
    return features


def candidate_targets(texts: list[str], reference: str) -> np.ndarray:
    """What the reranker learns to predict: each candidate's mean of its ROUGE-1, ROUGE-2 and ROUGE-L F-measures
    against the `reference` (0 to 1)."""
    scores = rouge_metric.load().compute(
        predictions=texts,
        references=[reference] * len(texts),
        rouge_types=["rouge1", "rouge2", "rougeL"],
        use_aggregator=False,
        use_stemmer=True,
    )
    return np.mean(list(scores.values()), axis=0)


class BeamReranker:
    """Linear weights over `FEATURES` (and a bias), and the `decoding` settings of the beams they were fit on (the
    rank and the score mean what those settings make of them); `choose` takes the allowed candidate with the highest
    prediction, the top beam always among them."""

    def __init__(self, weights: dict[str, float], decoding: dict | None = None):
        missing = {"bias", *FEATURES} - set(weights)
        if missing:
            raise ValueError(f"BeamReranker weights lack {sorted(missing)}")
        self.weights = {name: float(weights[name]) for name in ("bias", *FEATURES)}
        self.decoding = dict(decoding or {})

    @classmethod
    def fit(cls, features: list[np.ndarray], targets: list[np.ndarray], decoding: dict | None = None) -> "BeamReranker":
        """Least squares over every candidate of every article (`features` and `targets` per article)."""
        if not features or len(features) != len(targets):
            raise ValueError(f"need features and targets for the same articles, got {len(features)} and {len(targets)}")
        design = np.concatenate(features)
        design = np.concatenate([np.ones((len(design), 1)), design], axis=1)
        solution = np.linalg.lstsq(design, np.concatenate(targets), rcond=None)[0]
        return cls(dict(zip(("bias", *FEATURES), solution.tolist())), decoding)

    def predict(self, features: np.ndarray) -> np.ndarray:
        return self.weights["bias"] + features @ np.array([self.weights[name] for name in FEATURES])

    def choose(self, features: np.ndarray, allowed=None) -> int:
        """The index of the chosen candidate; `allowed` (a boolean per candidate) limits the choice, the top beam
        (index 0) always allowed."""
        predictions = self.predict(features)
        if allowed is not None:
            allowed = np.asarray(allowed, dtype=bool).copy()
            allowed[0] = True
            predictions = np.where(allowed, predictions, -np.inf)
        return int(np.argmax(predictions))

    def check_decoding(self, decoding: dict) -> None:
        """Refuses `decoding` settings that differ from those the reranker was fit under (a setting it does not
        record is not compared)."""
        differ = {name: (self.decoding[name], decoding[name]) for name in decoding.keys() & self.decoding.keys()}
        differ = {name: pair for name, pair in differ.items() if pair[0] != pair[1]}
        if differ:
            said = ", ".join(f"{name} {fit} (now {now})" for name, (fit, now) in sorted(differ.items()))
            raise ValueError(f"the beam reranker was fit on beams decoded with {said}")

    def save(self, path) -> None:
        saved = {"features": list(FEATURES), "weights": self.weights, "decoding": self.decoding}
        Path(path).write_text(json.dumps(saved, indent=2) + "\n")

    @classmethod
    def load(cls, path) -> "BeamReranker":
        saved = json.loads(Path(path).read_text())
        if list(saved.get("features", ())) != list(FEATURES):
            raise ValueError(f"{path} was fit on the features {saved.get('features')}, this version reads {FEATURES}")
        return cls(saved["weights"], saved.get("decoding"))


def cross_validated_choices(features, targets, allowed, folds: int = 5) -> list[int]:
    """Each article's choice by a reranker fit on the other folds (article i in fold i % `folds`): an estimate of
    the reranker on the split it is fit on."""
    if len(features) < 2:
        raise ValueError(f"cross-validation needs at least 2 articles, got {len(features)}")
    folds = min(folds, len(features))
    fitted = [
        BeamReranker.fit(
            [item for index, item in enumerate(features) if index % folds != fold],
            [item for index, item in enumerate(targets) if index % folds != fold],
        )
        for fold in range(folds)
    ]
    return [
        fitted[index % folds].choose(item, permitted) for index, (item, permitted) in enumerate(zip(features, allowed))
    ]
