"""What summarization with a Fastformer encoder-decoder needs beside the model: ROUGE scored offline, and the
encoder frozen for a decoder-only fine-tune (scripts/run_summarization.py and benchmarks/quality use both)."""

import numpy as np

ROUGE_TYPES = ["rouge1", "rouge2", "rougeL", "rougeLsum"]


def freeze_encoder(model) -> None:
    """No gradient for the encoder's parameters, but for those the decoder or the LM head also uses."""
    shared = {id(parameter) for parameter in model.get_decoder().parameters()}
    shared |= {id(parameter) for parameter in model.get_output_embeddings().parameters()}
    for parameter in model.get_encoder().parameters():
        if id(parameter) not in shared:
            parameter.requires_grad_(False)


def rouge(predictions: list[str], references: list[str]) -> dict[str, float]:
    """ROUGE F-measures x 100, aggregated as the `evaluate` rouge metric does, without the Hub; the bootstrap
    resampling is seeded, so the same texts always give the same numbers."""
    try:
        from rouge_score import rouge_scorer, scoring  # noqa: PLC0415  (the [train] extra)
    except ImportError as error:
        raise ImportError("ROUGE needs rouge_score: pip install 'fastformer[train]'") from error
    scorer = rouge_scorer.RougeScorer(ROUGE_TYPES, use_stemmer=True)
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
