"""The quality experiments as data: the classification tables (rows, tuning grid, seeds, subsets) and the
summarization rows with their grids. The runners (run.py, summarization.py) run them, report.py writes them up."""

from dataclasses import dataclass, field
from typing import NamedTuple


class Setting(NamedTuple):
    """One point of the classification tuning grid, as the script flags take it."""

    learning_rate: str
    warmup_steps: str


@dataclass(frozen=True)
class Model:
    """A classification table row: its label and the model scripts/run_classification.py trains."""

    label: str
    model_type: str
    overrides: str
    extra: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str, str]:
        """What its stored runs record: model type, overrides, extra flags."""
        return self.model_type, self.overrides, " ".join(self.extra)


@dataclass(frozen=True)
class Table:
    name: str
    title: str
    rows: tuple[Model, ...]
    samples: tuple[int, int, int]  # (training, validation, test) examples drawn from the data set


def overrides(size: dict) -> str:
    return ",".join(f"{name}={value}" for name, value in size.items())


# the paper's classification setting (hidden 256, 16 heads, 2 layers, dropout 0.2, Adam lr 1e-3, batch 64,
# max length 512) scaled to 2 CPU cores: half the width, heads of the same size, batch 32
PAPER = {"hidden_size": 256, "num_attention_heads": 16, "per_device_train_batch_size": 64}
SIZE = {"hidden_size": 128, "num_attention_heads": 8, "intermediate_size": 512, "num_hidden_layers": 2,
        "hidden_dropout_prob": 0.2}  # fmt: skip
FASTFORMER = overrides(SIZE)
# no dropout on BERT's attention weights: with it, CPU SDPA falls back to its unfused kernel and a step takes 5x
# as long (3.4 s against 0.7 s at batch 32 x 512 tokens, measured here), which 2 cores cannot afford
BERT = FASTFORMER + ",attention_probs_dropout_prob=0.0"
TRAINING = {"max_seq_length": 512, "num_train_epochs": 3, "per_device_train_batch_size": 32}
# the tuning grid every model gets: the paper's learning rate and a third of it, a short warm-up and one of about an
# epoch of the larger tables (3,000 documents / batch 32 = 94 steps)
GRID = (Setting("1e-3", "20"), Setting("1e-3", "100"), Setting("3e-4", "20"), Setting("3e-4", "100"))
SEEDS = (0, 1, 2)
DATA = "../shared/data/20newsgroups"  # the whole data set: 11,293 training and 7,528 test documents
DATA_SIZES = (11293, 7528)
# model types of baselines.py, which registers them and runs scripts/run_classification.py
BASELINES = ("bert_additive_pooling",)

TABLES = {
    table.name: table
    for table in (
        Table("classification", "Classification: Fastformer vs a Transformer of the same size", (
            Model("Fastformer", "fastformer", FASTFORMER),
            Model("Transformer (BERT, SDPA), additive pooling", "bert_additive_pooling", BERT),
            # the pooling of transformers' BertForSequenceClassification ([CLS]), in both attentions
            Model("Fastformer, [CLS] pooling", "fastformer", FASTFORMER + ",pooler_type=cls"),
            Model("Transformer (BERT, SDPA), [CLS] pooling", "bert", BERT),
        ), (3000, 600, 2000)),
        Table("interaction", "RQ2: the interaction function", (
            Model("product", "fastformer", FASTFORMER),
            Model("add", "fastformer", FASTFORMER + ",interaction=add"),
            Model("concat", "fastformer", FASTFORMER + ",interaction=concat"),
        ), (1500, 600, 1000)),
        Table("sharing", "RQ3: parameter sharing", (
            Model("none", "fastformer", FASTFORMER + ",share_query_value=false,share_layers=false"),
            Model("query-value", "fastformer", FASTFORMER + ",share_query_value=true,share_layers=false"),
            Model("query-value + head-wise", "fastformer",
                  FASTFORMER + ",share_query_value=true,share_layers=false,share_heads=true"),
            Model("query-value + layer-wise", "fastformer", FASTFORMER),
        ), (1500, 600, 1000)),
    )
}  # fmt: skip


# --- summarization: news articles -> headlines -------------------------------------------------------------------

LEAD_WORDS = range(1, 41)


@dataclass(frozen=True)
class Lever:
    """One step of a model family's tuning on the validation split: the settings it adds to the best so far. Keys
    beside the script's flags: `cross_attention_init` (the start: "random" or "self_attention"), `pretrain` (a
    pseudo-summary pretraining stage before the headlines: its pseudo-summary mode) and `continue` (the flags of a
    second stage from the headline run's model)."""

    name: str
    label: str
    settings: dict


# every family starts from the recipe with the cross-attention as transformers initializes a new one, and no stage
LEVER_BASE = {"cross_attention_init": "random", "pretrain": None}
LEVERS = (
    Lever("cross-attention init", "cross-attention from the same layer's pretrained self-attention",
          {"cross_attention_init": "self_attention"}),
    Lever("pseudo-summary pretraining", "first 1 epoch on lead-sentence pseudo-summaries of the unlabeled text",
          {"pretrain": "lead"}),
    Lever("label smoothing", "label smoothing 0.1", {"label_smoothing_factor": 0.1}),
    # once the decoder has settled: a second stage
    Lever("unfreezing", "then 1 epoch at lr 3e-5 with the encoder's top 2 layers trained (kept only while the token "
          "states stay apart)",
          {"continue": {"learning_rate": 3e-5, "num_train_epochs": 1, "train_encoder_layers": 2}}),
)  # fmt: skip
# unfreezing is kept only while the encoder's token-state spread stays above this share of the frozen encoder's
SPREAD_KEPT = 0.5
# the pretraining stage: one epoch over the pairs at half the source length (the texts' median is ~225 words), the
# recipe's settings otherwise; lead sentences are ~20 words
PRETRAIN = {"num_train_epochs": 1, "max_source_length": 256, "max_target_length": 48}
# the levers' runs are scored with greedy search (which has no length penalty: 1.0 is neutral)
LEVER_DECODING = {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0}
# the decodings each family's best model is scored with on the validation split; "length_window": generate between
# the 5th and 95th percentile of the training headlines' lengths in tokens
DECODING = [
    LEVER_DECODING,
    {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 3},
    {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 3},
    {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 3, "length_window": True},
]  # fmt: skip
# BERT2BERT: no dropout on the attention weights, which would make CPU SDPA fall back to its unfused kernel
# (5.0 s against 2.5 s a training step at batch 16 x 512 tokens here); the hidden dropout stays
BERT2BERT_DROPOUT = {"encoder_attention_probs_dropout_prob": 0.0, "decoder_attention_probs_dropout_prob": 0.0}


@dataclass(frozen=True)
class SummarizationRow:
    """A row of the summarization table: its label, the model family whose tuning it takes (rows of a family share
    it: the family's tuning runs at the recipe's source length), the recipe settings it changes, and those it
    changes in its training stages only."""

    label: str
    family: str | None = None
    settings: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)


ROWS = {
    "lead": SummarizationRow("lead-k (first k words)"),
    "fastformer-512": SummarizationRow("Fastformer, warm-started, source 512", "fastformer"),
    "fastformer-1024": SummarizationRow("Fastformer, warm-started, source 1,024", "fastformer",
                                        {"max_source_length": 1024}),
    # batches of articles of about the same length (transformers' LengthGroupedSampler), to fit the row in an hour:
    # random batches of 16 pad to 2.4x their real tokens at 2,048, in the stage that runs the encoder in every step
    "fastformer-2048": SummarizationRow("Fastformer, warm-started, source 2,048", "fastformer",
                                        {"max_source_length": 2048},
                                        {"train_sampling_strategy": "group_by_length"}),
    "bert2bert-512": SummarizationRow("BERT2BERT (softmax), warm-started, source 512", "bert2bert"),
}  # fmt: skip
