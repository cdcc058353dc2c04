"""fastformer/model_card.py: the README.md model card the training scripts write next to a checkpoint.

Each card is written for a tiny saved checkpoint (weights and tokenizer), so the card's code can be run as a
reader would: from the folder above the checkpoint, which the card names.
"""

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import BertConfig, BertForSequenceClassification

from fastformer import (
    FastformerConfig,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
)
from fastformer.model_card import write_model_card

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
LABELS = {0: "rec.autos", 1: "sci.space"}
HYPERPARAMETERS = {"learning_rate": 0.001, "train_batch_size": 64, "optimizer": "adamw_torch", "seed": 42}

# as the scripts write eval_results.json: quality metrics with all their digits, and bookkeeping
CLASSIFICATION_METRICS = {
    "eval_loss": 1.2345678901234567,
    "eval_accuracy": 0.8123456789012345,
    "eval_f1_macro": 0.7912345678901234,
    "eval_runtime": 1.23456,
    "eval_samples_per_second": 486.123,
    "eval_steps_per_second": 7.7,
    "epoch": 3.0,
    "eval_samples": 600,
}
SUMMARIZATION_METRICS = {
    "eval_loss": 4.567890123456789,
    "eval_rouge1": 0.25123456789,
    "eval_rouge2": 0.08123456789,
    "eval_rougeL": 0.22123456789,
    "eval_rougeLsum": 0.22234567891,
    "eval_gen_len": 12.3,
    "eval_runtime": 2.5,
    "eval_samples": 100,
}
MLM_METRICS = {"eval_loss": 5.432109876543211, "perplexity": 228.6012345678901, "eval_samples": 100, "epoch": 1.0}

# what the model-index must hold for each metrics dict: (type, name, config) -> value
EXPECTED_MODEL_INDEX = {
    "text-classification": {
        ("loss", "Loss", None): CLASSIFICATION_METRICS["eval_loss"],
        ("accuracy", "Accuracy", None): CLASSIFICATION_METRICS["eval_accuracy"],
        ("f1", "macro-F1", "macro"): CLASSIFICATION_METRICS["eval_f1_macro"],
    },
    "summarization": {
        ("loss", "Loss", None): SUMMARIZATION_METRICS["eval_loss"],
        ("rouge", "ROUGE-1", None): SUMMARIZATION_METRICS["eval_rouge1"],
        ("rouge", "ROUGE-2", None): SUMMARIZATION_METRICS["eval_rouge2"],
        ("rouge", "ROUGE-L", None): SUMMARIZATION_METRICS["eval_rougeL"],
        ("rouge", "ROUGE-Lsum", None): SUMMARIZATION_METRICS["eval_rougeLsum"],
    },
    "fill-mask": {
        ("loss", "Loss", None): MLM_METRICS["eval_loss"],
        ("perplexity", "Perplexity", None): MLM_METRICS["perplexity"],
    },
}


@dataclass
class Case:
    folder: str
    task: str
    dataset: str
    metrics: dict
    is_fastformer: bool

    def build(self, tokenizer_fields):
        if self.folder == "bert-classifier":
            return BertForSequenceClassification(BertConfig(**TINY, id2label=LABELS))
        if self.task == "text-classification":
            return FastformerForSequenceClassification(FastformerConfig(**TINY, id2label=LABELS))
        if self.task == "summarization":
            config = FastformerConfig(**TINY, num_decoder_layers=3, **tokenizer_fields)  # [CLS] starts, [SEP] ends
            return FastformerForConditionalGeneration(config)
        return FastformerForMaskedLM(FastformerConfig(**TINY))


CASES = [
    Case("fastformer-classifier", "text-classification", "data/20newsgroups", CLASSIFICATION_METRICS, True),
    Case("fastformer-summarizer", "summarization", "data/news_headlines", SUMMARIZATION_METRICS, True),
    Case("fastformer-mlm", "fill-mask", "someone/news-corpus", MLM_METRICS, True),
    Case("bert-classifier", "text-classification", "data/20newsgroups", CLASSIFICATION_METRICS, False),
]
FASTFORMER_CASES = [case for case in CASES if case.is_fastformer]
BERT_CASE = CASES[-1]


@dataclass
class Written:
    path: Path  # the checkpoint folder: weights, tokenizer, README.md
    model: object
    card: ModelCard  # what write_model_card returned


@pytest.fixture(scope="module")
def written(tmp_path_factory, tokenizer, tokenizer_fields):
    root = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    cards = {}
    for case in CASES:
        model = case.build(tokenizer_fields).eval()
        model.save_pretrained(root / case.folder)
        tokenizer.save_pretrained(root / case.folder)
        card = write_model_card(
            root / case.folder,
            model=model,
            task=case.task,
            dataset=case.dataset,
            metrics=case.metrics,
            hyperparameters=HYPERPARAMETERS,
        )
        cards[case.folder] = Written(root / case.folder, model, card)
    return cards


def by_folder(case):
    return case.folder


def code_blocks(card):
    return re.findall(r"```python\n(.*?)```", card.text, re.S)


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_readme_is_the_returned_card(written, case):
    entry = written[case.folder]
    assert (entry.path / "README.md").read_text(encoding="utf-8") == str(entry.card)
    assert str(entry.card).startswith("---\n")


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_metadata(written, case):
    data = ModelCard.load(written[case.folder].path / "README.md").data
    assert data.library_name == "transformers"
    assert data.license == "apache-2.0"
    assert data.pipeline_tag == case.task
    assert data.datasets == [case.dataset]
    assert data.language == "en"
    assert data.model_name == case.folder
    assert "base_model" not in data.to_dict()
    if case.is_fastformer:
        assert data.tags == ["fastformer", "additive-attention", case.task]
    else:
        assert data.tags == ["bert", case.task]


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_model_index_holds_the_exact_quality_metrics(written, case):
    loaded = ModelCard.load(written[case.folder].path / "README.md").data
    found = {
        (result.metric_type, result.metric_name, result.metric_config): result.metric_value
        for result in loaded.eval_results
    }
    # exactly equal: not rounded, and nothing else (runtime, samples, epoch, gen_len stay out)
    assert found == EXPECTED_MODEL_INDEX[case.task]
    assert all(type(value) is float for value in found.values())
    for result in loaded.eval_results:
        assert (result.task_type, result.dataset_type, result.dataset_name) == (case.task, case.dataset, case.dataset)
    assert loaded.metrics == list(dict.fromkeys(metric_type for metric_type, _, _ in EXPECTED_MODEL_INDEX[case.task]))
    assert loaded.eval_results == written[case.folder].card.data.eval_results  # the round trip


@pytest.mark.parametrize("case", FASTFORMER_CASES, ids=by_folder)
def test_fastformer_loading_instructions(written, case):
    text = written[case.folder].card.text
    auto_class = {
        "text-classification": "AutoModelForSequenceClassification",
        "summarization": "AutoModelForSeq2SeqLM",
        "fill-mask": "AutoModelForMaskedLM",
    }[case.task]
    assert "import fastformer" in text
    assert f'{auto_class}.from_pretrained("{case.folder}")' in text
    assert f'{auto_class}.from_pretrained("{case.folder}", trust_remote_code=True)' in text
    assert f'pipeline("{case.task}", model="{case.folder}", trust_remote_code=True)' in text


def test_baseline_card_says_so_and_needs_no_fastformer(written):
    text = written[BERT_CASE.folder].card.text
    assert "baseline, not a Fastformer" in text
    assert "import fastformer" not in text
    assert "trust_remote_code" not in text
    assert 'AutoModelForSequenceClassification.from_pretrained("bert-classifier")' in text
    assert 'pipeline("text-classification", model="bert-classifier")' in text
    assert "share_layers" not in text  # no Fastformer switches for BERT


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_card_code_runs(written, case, monkeypatch, capsys):
    entry = written[case.folder]
    monkeypatch.chdir(entry.path.parent)  # the card names the checkpoint by its folder
    blocks = code_blocks(entry.card)
    continuation = case.is_fastformer and case.task == "summarization"  # continuing from a returned cache
    assert len(blocks) == (3 + continuation if case.is_fastformer else 2)
    namespace = {}
    for block in blocks:  # in order, in one session, as a reader would
        exec(block, namespace)
    assert type(namespace["model"]) is type(entry.model)
    if continuation:
        first, more = namespace["out"].sequences, namespace["more"]
        assert torch.equal(more[:, : first.shape[1]], first) and more.shape[1] > first.shape[1]
    assert capsys.readouterr().out.strip()  # the pipeline printed its answer
    with torch.no_grad():
        for name, tensor in entry.model.state_dict().items():
            assert torch.equal(namespace["model"].state_dict()[name], tensor), name


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_architecture_and_parameters(written, case):
    entry = written[case.folder]
    text = entry.card.text
    for field in (
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "max_position_embeddings",
    ):
        assert f"| `{field}` | {getattr(entry.model.config, field)} |" in text
    assert f"Parameters: {entry.model.num_parameters():,}," in text
    assert f"Task head: `{type(entry.model).__name__}`" in text
    assert ("| `num_decoder_layers` | 3 |" in text) == (case.task == "summarization")


def test_fastformer_switches_in_card(written):
    text = written["fastformer-classifier"].card.text
    config = written["fastformer-classifier"].model.config
    assert f"| `share_query_value` | {config.share_query_value} |" in text
    assert f"| `share_layers` | {config.share_layers} |" in text
    assert f"| `share_heads` | {config.share_heads} |" in text
    assert f"| `interaction` | `{config.interaction}` |" in text
    assert f"| `pooler_type` | `{config.pooler_type}` |" in text
    assert "2 labels: rec.autos, sci.space" in text
    summarizer = written["fastformer-summarizer"].card.text
    assert "| `cross_attention_type` | `softmax` |" in summarizer
    assert "pooler_type" not in summarizer


def test_switches_follow_the_config(tmp_path):
    config = FastformerConfig(**TINY, share_layers=False, share_heads=True, interaction="concat")
    card = write_model_card(
        tmp_path / "variant",
        model=FastformerForMaskedLM(config),
        task="fill-mask",
        dataset="d",
        metrics={},
        hyperparameters={},
    )
    assert "| `share_layers` | False |" in card.text
    assert "| `share_heads` | True |" in card.text
    assert "| `interaction` | `concat` |" in card.text
    assert "shared layers counted once" not in card.text


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_hyperparameters_and_results_tables(written, case):
    text = written[case.folder].card.text
    for name, value in HYPERPARAMETERS.items():
        assert f"| `{name}` | {value} |" in text
    assert "| Loss | " in text
    assert f"| eval_samples | {case.metrics['eval_samples']} |" in text


def test_results_table_rounds(written):
    text = written["fastformer-classifier"].card.text
    assert "| Accuracy | 0.8123 |" in text
    assert "| macro-F1 | 0.7912 |" in text
    assert "| eval_runtime | 1.2346 |" in text


@pytest.mark.parametrize("case", CASES, ids=by_folder)
def test_citation_and_limitations(written, case):
    text = written[case.folder].card.text
    assert "@article{wu2021fastformer," in text
    assert "title   = {Fastformer: Additive Attention Can Be All You Need}" in text
    assert "journal = {arXiv preprint arXiv:2108.09084}" in text
    limitations = text.split("## Limitations")[1]
    assert "Trained from scratch" in limitations
    assert "English only" in limitations
    assert f"{written[case.folder].model.config.max_position_embeddings:,} tokens" in limitations


def test_base_model(tmp_path):
    model = FastformerForSequenceClassification(FastformerConfig(**TINY))
    card = write_model_card(
        tmp_path / "finetuned",
        model=model,
        task="text-classification",
        dataset="imdb",
        metrics={},
        hyperparameters={},
        base_model="someone/fastformer-base",
        license="mit",
    )
    data = ModelCard.load(tmp_path / "finetuned" / "README.md").data
    assert data.base_model == "someone/fastformer-base"
    assert data.license == "mit"
    assert "fine-tuned from `someone/fastformer-base`" in card.text
    assert "Trained from scratch" not in card.text


def test_no_metrics_no_model_index(tmp_path):
    model = FastformerForMaskedLM(FastformerConfig(**TINY))
    write_model_card(
        tmp_path / "mlm", model=model, task="fill-mask", dataset="d", metrics={"epoch": 1.0}, hyperparameters={}
    )
    loaded = ModelCard.load(tmp_path / "mlm" / "README.md")
    assert loaded.data.eval_results is None
    assert "model-index" not in loaded.data.to_dict()
    assert "metrics" not in loaded.data.to_dict()
    assert "| epoch | 1.0 |" in loaded.text


def test_numpy_metric_values_dump_as_plain_floats(tmp_path):
    model = FastformerForSequenceClassification(FastformerConfig(**TINY))
    metrics = {"eval_accuracy": np.float32(0.8125), "eval_f1_macro": np.float64(0.123456789012345)}
    write_model_card(
        tmp_path / "np", model=model, task="text-classification", dataset="d", metrics=metrics, hyperparameters={}
    )
    values = {
        result.metric_type: result.metric_value
        for result in ModelCard.load(tmp_path / "np" / "README.md").data.eval_results
    }
    assert values == {"accuracy": 0.8125, "f1": 0.123456789012345}


def test_creates_the_output_folder(tmp_path):
    model = FastformerForMaskedLM(FastformerConfig(**TINY))
    write_model_card(tmp_path / "a" / "b", model=model, task="fill-mask", dataset="d", metrics={}, hyperparameters={})
    assert (tmp_path / "a" / "b" / "README.md").is_file()


def test_unknown_task_is_refused(tmp_path):
    model = FastformerForSequenceClassification(FastformerConfig(**TINY))
    message = r"`task` must be one of \('text-classification', 'summarization', 'fill-mask'\), got 'translation'"
    with pytest.raises(ValueError, match=message):
        write_model_card(tmp_path / "x", model=model, task="translation", dataset="d", metrics={}, hyperparameters={})
    assert not (tmp_path / "x").exists()


def test_hyperparameter_with_a_pipe_keeps_the_table(tmp_path):
    model = FastformerForMaskedLM(FastformerConfig(**TINY))
    card = write_model_card(
        tmp_path / "pipe", model=model, task="fill-mask", dataset="d", metrics={}, hyperparameters={"note": "a|b\nc"}
    )
    assert "| `note` | a\\|b c |" in card.text
