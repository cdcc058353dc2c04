"""Fastformer on a GPU against its peers, in one run: the encoder's inference forward and forward+backward against
BERT-SDPA and the GEMM-only floor, the classification training step against BERT-SDPA, and decoding against
GPT-2-SDPA (prefill, ms per generated token, peak memory; by the forward with the cache, and by generate(), eager
and compiled). Timed with CUDA events after warm-up; each time is the median of --repeats calls. A correctness
check runs first, on the device: the fused poolings against the path that returns the weights, and against a
float64 copy of the model on the CPU.

    python -m benchmarks.gpu                        # BERT-base / GPT-2-small size, bf16, the whole table
    python -m benchmarks.gpu --device cpu --hidden-size 64 --layers 2 --heads 4 --forward-shapes 2x64 \\
        --training-shapes 2x64 --decoding-shapes 2x32 --new-tokens 4 --repeats 2     # toy size (the tests)

The GEMM-only floor (`GemmFloor`) is the embeddings and, per layer, one hidden x hidden map, the feed-forward block
and the two LayerNorms: what no implementation of a collapsed Fastformer layer avoids.
"""

import argparse
import statistics
import time
from pathlib import Path

import torch
import transformers
from torch import nn
from transformers import BertConfig, BertForSequenceClassification, BertModel, GPT2Config, GPT2LMHeadModel

from benchmarks.harness import DOCS, arguments, rows_table, write_record
from fastformer import FastformerConfig, FastformerForCausalLM, FastformerForSequenceClassification, FastformerModel
from fastformer.modeling_fastformer import FastformerEmbeddings, FastformerFeedForward

SIZE = {"hidden-size": 768, "layers": 12, "heads": 12, "vocab-size": 30522}
FORWARD_SHAPES = ["128x512", "32x2048", "8x8192", "2x32768", "1x131072"]
TRAINING_SHAPES = ["32x512", "4x4096"]
DECODING_SHAPES = ["1x512", "64x512", "8x4096", "8x32768"]  # batch x prompt tokens


class GemmFloor(nn.Module):
    """The embeddings, then per layer one (hidden x hidden) map with its residual and LayerNorm, and the feed-forward
    block: the GEMM work that no implementation of a collapsed Fastformer layer avoids (its M x_i), nothing else."""

    def __init__(self, config: FastformerConfig):
        super().__init__()
        self.embeddings = FastformerEmbeddings(config)
        self.maps = nn.ModuleList(
            nn.Linear(config.hidden_size, config.hidden_size) for _ in range(config.num_hidden_layers)
        )
        self.norms = nn.ModuleList(nn.LayerNorm(config.hidden_size) for _ in range(config.num_hidden_layers))
        self.feed_forward = nn.ModuleList(FastformerFeedForward(config) for _ in range(config.num_hidden_layers))

    def forward(self, input_ids) -> torch.Tensor:
        position_ids = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
        hidden_states = self.embeddings(input_ids, position_ids)
        for linear, norm, feed_forward in zip(self.maps, self.norms, self.feed_forward):
            hidden_states = feed_forward(norm(hidden_states + linear(hidden_states)))
        return hidden_states


def shapes(values) -> list[tuple[int, int]]:
    return [tuple(map(int, value.split("x"))) for value in values]


def parse_args(argv=None):
    parser = arguments(__doc__, threads=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    for flag, default in SIZE.items():
        parser.add_argument(f"--{flag}", type=int, default=default, help="of every model")
    parser.add_argument("--forward-shapes", nargs="+", default=FORWARD_SHAPES, help="batch x length")
    parser.add_argument("--training-shapes", nargs="+", default=TRAINING_SHAPES, help="batch x length")
    parser.add_argument("--decoding-shapes", nargs="+", default=DECODING_SHAPES, help="batch x prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=64, help="generated per decoding measurement")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per measurement, after one warm-up")
    parser.add_argument(
        "--compile", action=argparse.BooleanOptionalAction, default=None, help="generate() compiled too (GPU default)"
    )
    parser.add_argument("--output", type=Path, default=DOCS / "gpu.json", help="the record (a CSV beside it)")
    args = parser.parse_args(argv)
    args.compile = args.device.startswith("cuda") if args.compile is None else args.compile
    args.forward_shapes, args.training_shapes = shapes(args.forward_shapes), shapes(args.training_shapes)
    args.decoding_shapes = shapes(args.decoding_shapes)
    args.intermediate_size = 4 * args.hidden_size
    args.positions = max(length for _, length in args.forward_shapes + args.training_shapes)
    args.positions = max(args.positions, max(length for _, length in args.decoding_shapes) + args.new_tokens)
    return args


def configs(args) -> tuple[FastformerConfig, BertConfig, GPT2Config]:
    """Fastformer's default config at the benchmark's size (but one parameter set per layer, as its peers), BERT with
    SDPA and GPT-2 with SDPA of the same size; no dropout anywhere (the steps then time the same work every call)."""
    size = dict(hidden_size=args.hidden_size, num_attention_heads=args.heads, intermediate_size=args.intermediate_size)
    size.update(vocab_size=args.vocab_size, max_position_embeddings=args.positions, hidden_dropout_prob=0.0)
    fastformer = FastformerConfig(**size, num_hidden_layers=args.layers, share_layers=False, num_labels=2)
    bert = BertConfig(**size, num_hidden_layers=args.layers, attention_probs_dropout_prob=0.0, num_labels=2)
    bert._attn_implementation = "sdpa"  # what from_pretrained picks, set on a config built here
    gpt2 = dict(n_embd=args.hidden_size, n_layer=args.layers, n_head=args.heads, vocab_size=args.vocab_size)
    gpt2 = GPT2Config(**gpt2, n_positions=args.positions, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    gpt2._attn_implementation = "sdpa"
    return fastformer, bert, gpt2


class Timer:
    """Milliseconds of a call on the device: CUDA events around it on a GPU, the wall clock elsewhere; the median of
    `repeats` calls after one warm-up call."""

    def __init__(self, device: torch.device, repeats: int):
        self.cuda, self.repeats = device.type == "cuda", repeats

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def once(self, call) -> float:
        if not self.cuda:
            start = time.perf_counter()
            call()
            return 1000 * (time.perf_counter() - start)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median(self, call, setup=None) -> float:
        """`call()`, or `call(setup())` with an untimed `setup` before every call."""
        timed = call if setup is None else lambda: call(prepared)
        times = []
        for _ in range(1 + self.repeats):  # the first: warm-up
            prepared = None if setup is None else setup()
            self.sync()
            times.append(self.once(timed))
        return statistics.median(times[1:])


def peak_memory(device, call) -> float | None:
    """GB the device's allocator held at most during `call()` beyond what it held before (None off a GPU)."""
    if device.type != "cuda":
        call()
        return None
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    torch.cuda.synchronize()
    return round((torch.cuda.max_memory_allocated() - before) / 2**30, 3)


def ids(batch, length, args, device) -> torch.Tensor:
    generator = torch.Generator().manual_seed(batch * length)
    return torch.randint(1000, args.vocab_size, (batch, length), generator=generator).to(device)


def correctness(args, device, dtype) -> list[dict]:
    """On the device: the encoder's fused path (the default) against the path that returns the pooling weights, in
    float32 and in `dtype`, and against a float64 copy on the CPU, on a padded batch (relative max errors)."""
    fastformer, _, _ = configs(args)
    torch.manual_seed(0)
    reference = FastformerModel(fastformer, add_pooling_layer=False).eval().double()
    tokens = ids(2, min(64, args.positions), args, "cpu")
    mask = torch.ones_like(tokens)
    mask[1, : tokens.shape[1] // 3] = 0  # left padding
    with torch.no_grad():
        expected = reference(tokens, attention_mask=mask).last_hidden_state
    rows = []
    for check_dtype in dict.fromkeys((torch.float32, dtype)):
        model = FastformerModel(fastformer, add_pooling_layer=False).eval()
        model.load_state_dict(reference.state_dict())
        model.to(device, check_dtype)
        with torch.no_grad():
            fused = model(tokens.to(device), attention_mask=mask.to(device)).last_hidden_state
            weights = model(tokens.to(device), attention_mask=mask.to(device), output_attentions=True)
        real = mask.bool()
        scale = expected[real].abs().max().item()
        rows.append(
            {
                "check": "encoder, fused poolings",
                "dtype": str(check_dtype).removeprefix("torch."),
                "vs_weights_path": (fused - weights.last_hidden_state).double().cpu()[real].abs().max().item() / scale,
                "vs_float64_cpu": (fused.double().cpu() - expected)[real].abs().max().item() / scale,
            }
        )
    return rows


def encoder_rows(args, device, dtype, timer) -> list[dict]:
    """Inference forward and forward+backward (of the mean of the last hidden states) per shape: Fastformer, BERT-SDPA,
    the floor; the models in `dtype`."""
    fastformer, bert, _ = configs(args)
    torch.manual_seed(0)
    models = {
        "Fastformer": FastformerModel(fastformer, add_pooling_layer=False),
        "BERT-SDPA": BertModel(bert, add_pooling_layer=False),
        "floor": GemmFloor(fastformer),
    }
    rows = []
    for name, model in models.items():
        model.to(device, dtype)
        for batch, length in args.forward_shapes:
            tokens = ids(batch, length, args, device)

            def hidden(model=model, tokens=tokens):
                output = model(tokens)
                return output if isinstance(output, torch.Tensor) else output.last_hidden_state

            def forward():
                with torch.no_grad():
                    hidden()

            def forward_backward():
                model.zero_grad(set_to_none=True)
                hidden().float().mean().backward()

            model.eval()
            row = {"what": "encoder", "model": name, "batch": batch, "length": length}
            row["forward_ms"] = round(timer.median(forward), 3)
            row["forward_backward_ms"] = round(timer.median(forward_backward), 3)
            row["peak_gb"] = peak_memory(device, forward_backward)
            rows.append(row)
            print(row, flush=True)
        model.to("cpu")
        model.zero_grad(set_to_none=True)
    return rows


def training_rows(args, device, dtype, timer) -> list[dict]:
    """A sequence classifier's training step (forward, backward, AdamW; float32 weights under `dtype` autocast), per
    shape: Fastformer against BERT-SDPA."""
    fastformer, bert, _ = configs(args)
    torch.manual_seed(0)
    models = {
        "Fastformer": FastformerForSequenceClassification(fastformer),
        "BERT-SDPA": BertForSequenceClassification(bert),
    }
    rows = []
    for name, model in models.items():
        model.to(device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device.type == "cuda")
        for batch, length in args.training_shapes:
            tokens, labels = ids(batch, length, args, device), torch.zeros(batch, dtype=torch.long, device=device)

            def step(model=model, optimizer=optimizer, tokens=tokens, labels=labels):
                with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = model(input_ids=tokens, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

            row = {"what": "training step", "model": name, "batch": batch, "length": length}
            row["step_ms"] = round(timer.median(step), 3)
            row["peak_gb"] = peak_memory(device, step)
            rows.append(row)
            print(row, flush=True)
        model.to("cpu")
        del optimizer
    return rows


def decoding_rows(args, device, dtype, timer) -> list[dict]:
    """Greedy decoding by the models' forward with their caches, per batch x prompt: the prompt's forward (prefill),
    then --new-tokens steps (ms per token), and the peak memory of both: Fastformer's causal LM against GPT-2-SDPA."""
    fastformer, _, gpt2 = configs(args)  # the causal LM's decoder layers: num_hidden_layers
    torch.manual_seed(0)
    models = {"Fastformer": FastformerForCausalLM(fastformer), "GPT-2-SDPA": GPT2LMHeadModel(gpt2)}
    rows = []
    for name, model in models.items():
        model.to(device, dtype).eval()
        for batch, length in args.decoding_shapes:
            prompt = ids(batch, length, args, device)

            def prefill(model=model, prompt=prompt):
                with torch.no_grad():
                    output = model(prompt, use_cache=True, logits_to_keep=1)
                return output.logits[:, -1:].argmax(-1), output.cache

            def decode(state, model=model):
                token, cache = state
                with torch.no_grad():
                    for _ in range(args.new_tokens):
                        output = model(token, cache=cache, use_cache=True)
                        token, cache = output.logits.argmax(-1), output.cache

            row = {"what": "decoding", "model": name, "batch": batch, "prompt": length, "new_tokens": args.new_tokens}
            row["prefill_ms"] = round(timer.median(prefill), 3)
            row["ms_per_token"] = round(timer.median(decode, setup=prefill) / args.new_tokens, 4)
            row["peak_gb"] = peak_memory(device, lambda decode=decode, prefill=prefill: decode(prefill()))
            rows.append(row)
            print(row, flush=True)
        model.to("cpu")
    return rows


def generate_rows(args, device, dtype, timer, prefill_ms) -> list[dict]:
    """Greedy generate() of --new-tokens tokens per batch x prompt, as users call it: eager, and with each model's
    compilable cache, with which generate() compiles the decoding step on a GPU (transformers' CompileConfig:
    inductor, CUDA graphs): both with cache_implementation="static" (Fastformer's is its recurrent state). ms
    per token: the call's time less the prompt's forward (`prefill_ms`, from `decoding_rows`), per new token."""
    fastformer, _, gpt2 = configs(args)
    torch.manual_seed(0)
    models = {"Fastformer": FastformerForCausalLM(fastformer), "GPT-2-SDPA": GPT2LMHeadModel(gpt2)}
    variants = ["eager", "compiled"] if args.compile else ["eager"]
    rows = []
    for name, model in models.items():
        model.to(device, dtype).eval()
        for batch, length in args.decoding_shapes:
            prompt = ids(batch, length, args, device)
            for variant in variants:
                options = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False)
                if variant == "eager":
                    options["disable_compile"] = True
                else:
                    options["cache_implementation"] = "static"

                def generate(model=model, prompt=prompt, options=options):
                    with torch.no_grad():
                        model.generate(prompt, attention_mask=torch.ones_like(prompt), **options)

                row = {"what": f"generate, {variant}", "model": name, "batch": batch, "prompt": length}
                total = timer.median(generate)
                row["ms_per_token"] = round((total - prefill_ms[name, batch, length]) / args.new_tokens, 4)
                rows.append(row)
                print(row, flush=True)
        model.to("cpu")
    return rows


def ratios(rows) -> list[dict]:
    """The targets' ratios: Fastformer over the peer (and over the floor) for every measured pair."""
    index = {(row["what"], row["model"], row["batch"], row.get("length", row.get("prompt"))): row for row in rows}
    peers = {"encoder": ("BERT-SDPA", "floor"), "training step": ("BERT-SDPA",)}
    columns = {
        "encoder": ("forward_ms", "forward_backward_ms", "peak_gb"),
        "training step": ("step_ms", "peak_gb"),
        "decoding": ("prefill_ms", "ms_per_token", "peak_gb"),
    }
    for variant in ("eager", "compiled"):
        columns[f"generate, {variant}"] = ("ms_per_token",)
    for what in columns:
        peers.setdefault(what, ("GPT-2-SDPA",))
    out = []
    for (what, model, batch, length), row in index.items():
        if model != "Fastformer":
            continue
        for peer in peers[what]:
            other = index.get((what, peer, batch, length))
            for column in columns[what]:
                if other is not None and row.get(column) and other.get(column):
                    ratio = round(row[column] / other[column], 3)
                    out.append({"what": what, "batch": batch, "length": length, "column": column, "over": peer})
                    out[-1]["fastformer_over_peer"] = ratio
    return out


def main(argv=None):
    args = parse_args(argv)
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    transformers.logging.set_verbosity_error()
    timer = Timer(device, args.repeats)
    checks = correctness(args, device, dtype)
    print(rows_table(checks), flush=True)
    rows = encoder_rows(args, device, dtype, timer) + training_rows(args, device, dtype, timer)
    decoding = decoding_rows(args, device, dtype, timer)
    prefill_ms = {(row["model"], row["batch"], row["prompt"]): row["prefill_ms"] for row in decoding}
    rows += decoding + generate_rows(args, device, dtype, timer, prefill_ms)
    settings = {key: value for key, value in vars(args).items() if key != "output"}
    record = write_record(args.output, rows, settings, checks=checks, ratios=ratios(rows))
    print(rows_table(rows))
    print(rows_table(record["ratios"]))
    return record


if __name__ == "__main__":
    main()
