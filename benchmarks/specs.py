"""The performance, pretrained and deployment experiments as data: the targets the suite checks, the pretrained
benchmark's fine-tuning rows and goals, the model sizes. The runners and their reports read them."""

from dataclasses import dataclass

from benchmarks.harness import REPO


@dataclass(frozen=True)
class Target:
    """A ratio the performance issue asks for: `measure` at `length` tokens of `numerator` over `denominator`."""

    measure: str
    length: int
    numerator: str
    denominator: str
    required: str  # e.g. "<= 1.10"


ENCODER_MEASURES = {"forward_ms": "forward time", "forward_backward_ms": "forward+backward time",
                    "peak_mb": "peak memory"}  # fmt: skip
ENCODER_TARGETS = [
    Target("forward_ms", 16384, "Fastformer", "floor", "<= 1.10"),
    Target("forward_ms", 16384, "fast-transformer-pytorch", "Fastformer", ">= 1.15"),
    Target("forward_ms", 16384, "BERT", "Fastformer", ">= 6"),
    Target("forward_backward_ms", 8192, "Fastformer", "floor", "<= 1.3"),
    Target("peak_mb", 8192, "Fastformer", "floor", "<= 1.5"),
]
# decoding: Fastformer's ms/token flat (longest / shortest length), its cache constant, at least as fast as BART of
# the same size from the shortest length on
DECODING_FLAT, DECODING_CACHE, DECODING_FASTER = "<= 1.1", "== 1", ">= 1"
ENCODER_RATIOS = [("Fastformer", "floor"), ("Fastformer-plain", "floor"), ("fast-transformer-pytorch", "Fastformer"),
                  ("BERT", "Fastformer")]  # fmt: skip


@dataclass(frozen=True)
class FinetuneRow:
    """A row of the pretrained benchmark's fine-tuning table: `start` is "teacher", "converted" or None (from
    scratch, with the teacher's tokenizer and `config_overrides`, if any, on the paper-size default)."""

    key: str  # the --rows choice
    label: str  # as the table and docs/pretrained_runs.json name it
    start: str | None = None
    config_overrides: str | None = None


SAME_SIZE = (
    "hidden_size=384,num_hidden_layers=6,num_attention_heads=12,intermediate_size=1536,share_layers=false,"
    "share_query_value=false,query_residual=false,pooler_type=mean,hidden_dropout_prob=0.1"
)
FINETUNE_ROWS = [
    FinetuneRow("teacher", "teacher (all-MiniLM-L6-v2 as a BERT classifier)", "teacher"),
    FinetuneRow("converted", "converted + distilled Fastformer", "converted"),
    FinetuneRow("same-size", "Fastformer, same size, from scratch", config_overrides=SAME_SIZE),
    FinetuneRow("paper-size", "Fastformer, paper size, from scratch"),
]
SPLITS = {
    "newsgroups": REPO / "data" / "20newsgroups" / "train.jsonl",
    "fewshot": REPO / "data" / "20newsgroups_fewshot" / "train.jsonl",
}
SPLIT_TITLES = {"newsgroups": "2,400 training texts (the README main job's data)",
                "fewshot": "few-shot: 10 training texts per class (200)"}  # fmt: skip
EPOCHS = {"newsgroups": 3, "fewshot": 10}  # the few-shot split's 200 texts take 7 steps an epoch
TEST = REPO / "data" / "20newsgroups" / "test.jsonl"
DISTILL_FILE = REPO / "data" / "distillation" / "train.jsonl.gz"  # the README conversion's distillation texts


@dataclass(frozen=True)
class Lever:
    """A conversion of the pretrained benchmark's lever table: the README's conversion command with `flags` added."""

    key: str  # the --levers choice, and the folder's name under --work/levers
    label: str
    flags: tuple[str, ...] = ()


LEAST_SQUARES = ("--least_squares_start", "true")
NO_STEPS = ("--max_steps", "0", "--end_to_end_steps", "0")
EVERY_LAYER = ("--end_to_end_matched", "all")  # the default until 2026-12-02
LEVERS = [
    Lever("no-transfer", "the weights mapped, no transfer", NO_STEPS),
    Lever("least-squares", "least-squares start alone", (*LEAST_SQUARES, *NO_STEPS)),
    Lever("layerwise", "500 layerwise steps, no end-to-end stage", ("--end_to_end_steps", "0")),
    Lever("ls-layerwise", "least-squares start, 500 layerwise steps, no end-to-end stage",
          (*LEAST_SQUARES, "--end_to_end_steps", "0")),
    Lever("e2e-all", "500 layerwise + 350 end-to-end steps, every layer matched (the former default)", EVERY_LAYER),
    Lever("ls200", "least-squares start, 200 layerwise + 500 end-to-end steps, every layer matched",
          (*LEAST_SQUARES, "--max_steps", "200", "--end_to_end_steps", "500", *EVERY_LAYER)),
    Lever("e2e-lr1e-3", "500 layerwise + 350 end-to-end steps, every layer matched, end-to-end learning rate 1e-3",
          ("--end_to_end_learning_rate", "1e-3", *EVERY_LAYER)),
    Lever("e2e700", "500 layerwise + 700 end-to-end steps, every layer matched",
          ("--end_to_end_steps", "700", *EVERY_LAYER)),
    Lever("e2e-last", "500 layerwise + 350 end-to-end steps, the last layer matched",
          ("--end_to_end_matched", "last")),
    Lever("e2e700-last", "500 layerwise + 700 end-to-end steps, the last layer matched",
          ("--end_to_end_steps", "700", "--end_to_end_matched", "last")),
    Lever("e2e-pooled", "500 layerwise + 350 end-to-end steps, the last layer and the pooled embedding matched "
          "(the default)",
          ("--end_to_end_matched", "pooled")),
]  # fmt: skip
# the accuracy-vs-minutes curve: the levers that take the former default's recipe (every layer matched) with fewer
# or more steps
CURVE = ("no-transfer", "layerwise", "e2e-all", "e2e700")


@dataclass(frozen=True)
class DocumentRow:
    """A row of the long-document table: `start` ("teacher" or "converted") fine-tuned on the 2,400 texts cut to
    `train_length` tokens, then reading the long test documents cut to each of `reads` (None: whole)."""

    start: str
    train_length: int
    reads: tuple[int | None, ...]


DOCUMENT_ROWS = [
    DocumentRow("teacher", 128, (512,)),
    DocumentRow("converted", 1024, (512, None)),
    DocumentRow("converted", 128, (512, None)),
]
DOCUMENT_MIN_TOKENS = 512  # the long-document table's test documents: 20 Newsgroups' longer than the teacher reads
LONG_LENGTHS = (512, 2048, 8192)
CONVERTED, TEACHER = "converted Fastformer", "teacher (BERT, positions extended)"  # the long part's models
# the memory part: the feed-forward blocks whole (0) and in chunks of this many tokens (FastformerConfig's default;
# BERT's own chunking, transformers' apply_chunking_to_forward, needs a length that it divides)
MEMORY_CHUNKS = (0, 256)
MMAP_THRESHOLD = 64 * 1024  # fixed (glibc starts at 128 KiB and raises it as memory is freed; harness.peak_megabytes)
# the goals, each checked against the numbers: the converted model's fine-tuned accuracy as a share of the
# teacher's, its margin over the best model from scratch, the distillation's minutes, the speedup at 8,192 tokens
GOAL_ACCURACY, GOAL_MARGIN, GOAL_MINUTES, GOAL_SPEEDUP = 0.97, 0.05, 30, 5

# deploy: a FastformerModel of all-MiniLM-L6-v2's size
MINILM_SIZE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536,
                   share_layers=False, share_query_value=False, hidden_dropout_prob=0.0)  # fmt: skip
