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
# the warm-started rows: the encoder frozen (only the new cross-attention and the decoder learn) at the learning rates
# of a freshly initialized part, or fine-tuned with them at smaller ones (in development, 1e-4 and more collapsed the
# encoder's token states within a few dozen steps: encoder_collapse.py)
WARM_GRID = [
    *({"freeze_encoder": True, "learning_rate": rate} for rate in (3e-4, 1e-3, 3e-3)),
    *({"freeze_encoder": False, "learning_rate": rate} for rate in (3e-5, 1e-4, 3e-4)),
]  # fmt: skip
PROXY = {"max_source_length": 256, "num_train_epochs": 2, "num_beams": 1, "length_penalty": None,
         "no_repeat_ngram_size": None}  # fmt: skip
DECODING = [  # greedy search has no length penalty: 1.0 is neutral
    {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 0},
    {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 3},
    *({"num_beams": 4, "length_penalty": penalty, "no_repeat_ngram_size": size}
      for penalty in (0.6, 1.0, 1.4) for size in (0, 3)),
]  # fmt: skip
# BERT2BERT: no dropout on the attention weights, which would make CPU SDPA fall back to its unfused kernel
# (5.0 s against 2.5 s a training step at batch 16 x 512 tokens here); the hidden dropout stays
BERT2BERT_DROPOUT = {"encoder_attention_probs_dropout_prob": 0.0, "decoder_attention_probs_dropout_prob": 0.0}
# from scratch: nothing to freeze; the grid reaches below 3e-4 (in development, a Fastformer's proxy reached
# validation ROUGE-1 3.96 at 3e-4 and 0.00 at 1e-3: the best sat at the grid's lower edge)
SCRATCH_GRID = [{"learning_rate": rate} for rate in (1e-4, 3e-4, 1e-3)]
# from scratch: the warm-started models' size (MiniLM: hidden 384, 12 heads, feed-forward 1,536, 6 + 6 layers), the
# bundled bert-base-uncased tokenizer (MiniLM's vocabulary), until validation ROUGE-1 stops improving
SCRATCH = {"model_name_or_path": None, "freeze_encoder": False, "num_train_epochs": 30, "early_stopping_patience": 2}
FASTFORMER_SIZE = (
    "hidden_size=384,num_attention_heads=12,intermediate_size=1536,num_hidden_layers=6,num_decoder_layers=6,"
    "share_layers=false,max_position_embeddings=512"
)
BART_SIZE = (
    "d_model=384,encoder_attention_heads=12,decoder_attention_heads=12,encoder_ffn_dim=1536,decoder_ffn_dim=1536,"
    "encoder_layers=6,decoder_layers=6,max_position_embeddings=512"
)


@dataclass(frozen=True)
class SummarizationRow:
    """A row of the summarization table: its label, the family of rows that share its tuning, its training grid,
    the recipe settings it changes."""

    label: str
    family: str | None = None
    grid: list = field(default_factory=lambda: WARM_GRID)
    settings: dict = field(default_factory=dict)


ROWS = {
    "lead": SummarizationRow("lead-k (first k words)"),
    "fastformer-512": SummarizationRow("Fastformer, warm-started, source 512", "fastformer-warm"),
    "fastformer-1024": SummarizationRow("Fastformer, warm-started, source 1,024", "fastformer-warm",
                                        settings={"max_source_length": 1024}),
    "bert2bert-512": SummarizationRow("BERT2BERT (softmax), warm-started, source 512", "bert2bert",
                                      settings={"model_name_or_path": "BERT2BERT"}),
    "fastformer-scratch": SummarizationRow(
        "Fastformer, from scratch, source 512", "fastformer-scratch", SCRATCH_GRID,
        {**SCRATCH, "model_type": "fastformer", "config_overrides": FASTFORMER_SIZE},
    ),
    "bart-scratch": SummarizationRow(
        "BART (softmax), from scratch, source 512", "bart-scratch", SCRATCH_GRID,
        {**SCRATCH, "model_type": "bart", "config_overrides": BART_SIZE},
    ),
}  # fmt: skip
