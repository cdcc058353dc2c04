"""The operators a step dispatches, Fastformer beside BERT with SDPA: what a GPU launches, counted on the CPU.

Each aten operator that computes (views, `detach` and `alias` left out) is one kernel launch on a GPU, so the count
tracks a step's launch overhead where no GPU is at hand. Host reads (`item`, `nonzero`: a device-to-host
synchronization each on a GPU) are counted apart. Rows: an inference forward (no gradients, eval mode) and a training
step's forward and backward (float32 and bf16 autocast; dropout on) of the sequence classifier, for each model and
shape; and a decoding step (one token after a prompt, with the cache) of the causal LM beside GPT-2 with SDPA.

    python -m benchmarks.operators                     # BERT-base size, 2 x 512 and 1 x 8,192 tokens
    python -m benchmarks.operators --hidden-size 64 --layers 2 --heads 4 --shapes 2x32   # toy size (the tests)
"""

import collections
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig, BertForSequenceClassification, GPT2Config, GPT2LMHeadModel

from benchmarks.harness import DOCS, arguments, random_ids, rows_table, write_record
from fastformer import FastformerConfig, FastformerForCausalLM, FastformerForSequenceClassification

UNCOUNTED = {"aten::detach", "aten::alias", "aten::lift_fresh", "aten::_unsafe_view"}  # no work: the same data
HOST_READS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::item"}


class OperatorCount(TorchDispatchMode):
    """Counts the aten operators dispatched inside it: `compute` by name (views and `UNCOUNTED` left out), and
    `host_reads`."""

    def __init__(self):
        super().__init__()
        self.compute = collections.Counter()
        self.host_reads = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.name()
        if not func.is_view and name not in UNCOUNTED:
            self.compute[name] += 1
        self.host_reads += name in HOST_READS
        return func(*args, **(kwargs or {}))


def models(args) -> dict:
    """BERT with SDPA and Fastformer (its default config but for the size, and no layer sharing; and with
    `cls_attention_heads`), same size."""
    size = dict(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden_size,
        max_position_embeddings=max(batch_length[1] for batch_length in args.shapes),
        num_labels=2,
    )
    torch.manual_seed(0)
    bert = BertForSequenceClassification(BertConfig(**size, attn_implementation="sdpa"))
    fastformer = FastformerForSequenceClassification(FastformerConfig(**size, share_layers=False))
    # a converted classifier's: its [CLS] attends by softmax in the last layer
    converted = FastformerConfig(**size, share_layers=False, cls_attention_heads=args.heads)
    return {
        "BERT-SDPA": bert,
        "Fastformer": fastformer,
        "Fastformer, [CLS] softmax": FastformerForSequenceClassification(converted),
    }


def decoders(args) -> dict:
    """GPT-2 with SDPA and Fastformer's causal LM (its default config but for the size, and no layer sharing), the
    same size as `models`'."""
    positions = max(args.decoding_prompts) + 2
    gpt2 = GPT2Config(n_embd=args.hidden_size, n_layer=args.layers, n_head=args.heads, n_positions=positions)
    gpt2._attn_implementation = "sdpa"  # what from_pretrained picks, set on a config built here
    size = dict(hidden_size=args.hidden_size, num_hidden_layers=args.layers, num_attention_heads=args.heads)
    fastformer = FastformerConfig(**size, intermediate_size=4 * args.hidden_size, max_position_embeddings=positions)
    torch.manual_seed(0)
    models = {"GPT-2-SDPA": GPT2LMHeadModel(gpt2), "Fastformer": FastformerForCausalLM(fastformer)}
    return {name: model.eval() for name, model in models.items()}


def decoding(model, ids):
    """One greedy decoding step after the prompt `ids`, with the cache the prompt's forward returned (each call
    continues the same cache by one token)."""
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache
    token = ids[:, -1:]

    def step():
        with torch.no_grad():
            model(token, cache=cache, use_cache=True)

    return step


def count(step) -> OperatorCount:
    step()  # a first call settles what is made once (lazy buffers, caches)
    with OperatorCount() as counted:
        step()
    return counted


def inference(model, ids, mask):
    def step():
        with torch.no_grad():
            model(input_ids=ids, attention_mask=mask)

    model.eval()
    return step


def training(model, ids, mask, dtype):
    """A training step's forward and backward. The optimizer is left out: on a GPU it is one fused kernel (or a few
    foreach ones), where the CPU's per-parameter loop would count hundreds."""
    labels = torch.zeros(ids.shape[0], dtype=torch.long)

    def step():
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        model.zero_grad(set_to_none=True)

    model.train()
    return step


def parse_args(argv=None):
    parser = arguments(__doc__)
    parser.add_argument("--hidden-size", type=int, default=768)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--shapes", nargs="+", default=["2x512", "1x8192"], help="batch x length, each")
    parser.add_argument("--training-shapes", nargs="+", default=["2x512"], help="batch x length of the steps")
    parser.add_argument("--decoding-prompts", nargs="+", type=int, default=[512], help="tokens before a step")
    parser.add_argument("--output", type=Path, default=DOCS / "operators.json")
    args = parser.parse_args(argv)
    args.shapes = [tuple(map(int, shape.split("x"))) for shape in args.shapes]
    args.training_shapes = [tuple(map(int, shape.split("x"))) for shape in args.training_shapes]
    return args


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    steps = [("inference", shape, torch.float32) for shape in args.shapes]
    steps += [("training", shape, dtype) for shape in args.training_shapes for dtype in (torch.float32, torch.bfloat16)]
    steps += [("decoding step", (1, length), torch.float32) for length in args.decoding_prompts]
    for kind, (batch, length), dtype in steps:
        ids, mask = random_ids(length).expand(batch, -1).contiguous(), torch.ones(batch, length, dtype=torch.long)
        counts = {}
        for name, model in (decoders(args) if kind == "decoding step" else models(args)).items():
            if kind == "decoding step":
                step = decoding(model, ids)
            else:
                step = inference(model, ids, mask) if kind == "inference" else training(model, ids, mask, dtype)
            counted = count(step)
            counts[name] = sum(counted.compute.values())
            rows.append(
                {
                    "model": name,
                    "step": kind,
                    "batch": batch,
                    "length": length,
                    "dtype": str(dtype).removeprefix("torch."),
                    "operators": counts[name],
                    "host_reads": counted.host_reads,
                    "top": dict(counted.compute.most_common(5)),
                }
            )
        peer = "GPT-2-SDPA" if kind == "decoding step" else "BERT-SDPA"
        for row in rows[-len(counts) :]:
            if row["model"] != peer:
                row["vs_peer"] = round(row["operators"] / counts[peer], 2)
    settings = {key: value for key, value in vars(args).items() if key != "output"}
    write_record(args.output, rows, settings)
    print(rows_table([{key: value for key, value in row.items() if key != "top"} for row in rows]))
    return rows


if __name__ == "__main__":
    main()
