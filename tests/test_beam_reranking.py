"""The beam reranker (scripts/beam_reranking.py) and the span processor's clause ends it chooses among."""

import json

import numpy as np
import pytest

from beam_reranking import (
    FEATURES,
    BeamReranker,
    candidate_features,
    candidate_targets,
    cross_validated_choices,
)
from headline_decoding import SourceSpanLogitsProcessor

ARTICLE = "Floods hit the coast of Kerala on Monday, killing two people. Floods in Kerala are common in June."


def test_candidate_features_read_rank_score_length_and_the_articles_keywords():
    texts = ["floods hit coast of kerala", "floods hit coast", "two people died on monday in june"]
    features = candidate_features(texts, [-0.5, -0.7, -1.2], ARTICLE, keywords=2)  # keywords: "floods kerala"
    column = {name: features[:, index].tolist() for index, name in enumerate(FEATURES)}
    assert column["rank"] == [0, 1, 2]
    assert column["score"] == [-0.5, -0.7, -1.2] and column["score_minus_top"] == pytest.approx([0, -0.2, -0.7])
    assert column["words"] == [5, 3, 7] and column["words_minus_top"] == [0, -2, 2]
    assert column["keywords_held"] == [2, 1, 0] and column["keywords_share"] == pytest.approx([2 / 5, 1 / 3, 0])
    # a plural and its singular are one stem, as ROUGE reads them
    assert candidate_features(["flood in kerala"], [0.0], ARTICLE, keywords=2)[0, 5] == 2
    with pytest.raises(ValueError, match="one score per candidate"):
        candidate_features(texts, [-0.5], ARTICLE)


def test_candidate_targets_are_the_mean_of_rouge_1_2_and_l():
    targets = candidate_targets(
        ["floods hit kerala coast", "storm in delhi", "kerala floods hit coast"], "Floods hit Kerala coast"
    )
    assert targets[0] == pytest.approx(1.0) and targets[1] == 0
    # the same words in another order: ROUGE-1 1, ROUGE-2 1/3 (one bigram of 3), ROUGE-L 3/4
    assert targets[2] == pytest.approx((1 + 1 / 3 + 3 / 4) / 3)


def test_reranker_fit_recovers_a_linear_target_and_chooses_among_the_allowed(tmp_path):
    generator = np.random.default_rng(0)
    weights = {"bias": 0.2, **{name: generator.normal() for name in FEATURES}}
    articles = [generator.normal(size=(4, len(FEATURES))) for _ in range(30)]
    targets = [weights["bias"] + article @ np.array([weights[name] for name in FEATURES]) for article in articles]
    reranker = BeamReranker.fit(articles, targets, {"num_beams": 4})
    assert reranker.weights == pytest.approx(weights)
    features = articles[0]
    best = int(np.argmax(targets[0]))
    assert reranker.choose(features) == best
    # only the allowed: the best of those, and the top beam where none is
    allowed = [True] * 4
    allowed[best] = False
    assert reranker.choose(features, allowed) == int(np.argmax(np.where(allowed, targets[0], -np.inf)))
    if best != 0:
        assert reranker.choose(features, [False] * 4) == 0
    reranker.save(tmp_path / "beam_reranker.json")
    loaded = BeamReranker.load(tmp_path / "beam_reranker.json")
    assert loaded.weights == reranker.weights and loaded.decoding == {"num_beams": 4}
    loaded.check_decoding({"num_beams": 4, "length_penalty": 1.0})  # what it does not record is not compared
    with pytest.raises(ValueError, match="fit on beams decoded with num_beams 4 \\(now 8\\)"):
        loaded.check_decoding({"num_beams": 8})
    saved = json.loads((tmp_path / "beam_reranker.json").read_text())
    saved["features"] = ["rank", "score"]
    (tmp_path / "other.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="was fit on the features"):
        BeamReranker.load(tmp_path / "other.json")
    with pytest.raises(ValueError, match="lack"):
        BeamReranker({"bias": 0.0})


def test_cross_validated_choices_come_from_rerankers_fit_without_the_articles_fold():
    generator = np.random.default_rng(1)
    articles = [generator.normal(size=(3, len(FEATURES))) for _ in range(12)]
    targets = [generator.normal(size=3) for _ in range(12)]
    allowed = [[True, bool(index % 2), True] for index in range(12)]
    choices = cross_validated_choices(articles, targets, allowed, folds=3)
    for index in (0, 7):
        others = [other for other in range(12) if other % 3 != index % 3]
        fitted = BeamReranker.fit([articles[other] for other in others], [targets[other] for other in others])
        assert choices[index] == fitted.choose(articles[index], allowed[index])
    assert all(choice != 1 for choice, allows in zip(choices, allowed) if not allows[1])
    with pytest.raises(ValueError, match="at least 2 articles"):
        cross_validated_choices(articles[:1], targets[:1], allowed[:1])


def test_span_processor_tells_which_summaries_copy_one_span_up_to_a_clause_end(tokenizer):
    """A summary qualifies where its tokens (special tokens skipped) are one run of its own article followed there by
    a clause's mark: not a join of two places, not a phrase cut short, not a point inside a number, not another
    article's clause."""
    processor = SourceSpanLogitsProcessor(tokenizer, 1.0, eos_token_id=tokenizer.sep_token_id)
    articles = ["floods hit the coast, killing two. prices rose 4.5 percent", "prices rose 4.5 percent; floods hit"]
    encoded = tokenizer(articles, padding=True, return_tensors="pt")
    processor.set_source(encoded["input_ids"], encoded["attention_mask"])

    def copied(article, summary):
        ids = [tokenizer.cls_token_id, *tokenizer(summary, add_special_tokens=False)["input_ids"]]
        return processor.copied_to_clause_end(article, ids + [tokenizer.sep_token_id, tokenizer.pad_token_id])

    assert copied(0, "floods hit the coast") and copied(0, "killing two") and copied(0, "hit the coast")
    assert copied(0, "floods hit the coast, killing two") and copied(0, "coast")
    assert not copied(0, "floods hit") and not copied(0, "prices rose 4") and not copied(0, "floods hit killing two")
    assert copied(1, "prices rose 4.5 percent") and not copied(0, "prices rose 4.5 percent")  # the article's end: none
    assert not copied(1, "floods hit the coast")  # another article's clause
    assert not processor.copied_to_clause_end(0, [tokenizer.cls_token_id, tokenizer.sep_token_id])
