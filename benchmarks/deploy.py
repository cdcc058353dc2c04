"""ONNX Runtime against PyTorch eager on the CPU, side by side in one run; writes docs/DEPLOY.md's measured part
(below the MEASURED line; the text above it is written by hand) and docs/deploy.json. The report's sections say how
each part ran:

1. encoder latency, float32 and int8, on the graph scripts/export_onnx.py writes, for a FastformerModel of
   all-MiniLM-L6-v2's size (specs.MINILM_SIZE, or --size) at each of --lengths;
2. greedy decoding of --new_tokens tokens, PyTorch generate() against fastformer.export.onnx_greedy_generate on
   the exported graphs, from a source of each --source_lengths;
3. what int8 costs a fine-tuned classifier (--classifier; default what the README's Quickstart command writes) on
   --test_file.

    python -m benchmarks.deploy                       # every part, docs/DEPLOY.md and docs/deploy.json
    python -m benchmarks.deploy --lengths 128 512     # a quick check
    python -m benchmarks.deploy --report              # docs/DEPLOY.md's measured part from docs/deploy.json
"""

import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from benchmarks.harness import (
    DOCS,
    MEASURED,
    REPO,
    arguments,
    read_json,
    read_jsonl,
    relative,
    run_lines,
    seconds_per_call,
    table,
    write_json,
)
from benchmarks.specs import MINILM_SIZE
from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerModel
from fastformer.export import (
    export_onnx,
    export_seq2seq_onnx,
    initial_state,
    onnx_greedy_generate,
    onnx_sessions,
    quantize_int8,
)


def parse_args(argv=None):
    parser = arguments(__doc__, threads=2, repeats=3, report="only rewrite the measured part from deploy.json")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 4096])
    parser.add_argument("--source_lengths", type=int, nargs="+", default=[64, 1024], help="for decoding")
    parser.add_argument("--new_tokens", type=int, default=32, help="greedy tokens generated per source")
    parser.add_argument("--size", type=json.loads, default=MINILM_SIZE, help="JSON of config fields replacing "
                        "MINILM_SIZE (tests)")  # fmt: skip
    parser.add_argument("--classifier", type=Path, default=REPO / "runs" / "20newsgroups")
    parser.add_argument("--test_file", type=Path, default=REPO / "data" / "20newsgroups" / "test.jsonl")
    parser.add_argument("--max_length", type=int, default=256, help="the classifier's training length")
    parser.add_argument("--markdown", type=Path, default=DOCS / "DEPLOY.md")
    return parser.parse_args(argv)


def session(path: Path, threads: int) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def runtimes(model, folder: Path, threads: int) -> dict:
    """PyTorch eager, ONNX Runtime float32 and int8 for `model`: name -> (inputs as numpy) -> outputs as numpy."""
    float32 = export_onnx(model, folder / "model.onnx")
    int8 = quantize_int8(float32, folder / "model_quantized.onnx")
    sessions = {"ONNX Runtime fp32": session(float32, threads), "ONNX Runtime int8": session(int8, threads)}

    def eager(inputs):
        with torch.no_grad():
            return [model(**{name: torch.from_numpy(value) for name, value in inputs.items()})[0].numpy()]

    return {"PyTorch eager": eager, **{name: (lambda inputs, s=s: s.run(None, inputs)) for name, s in sessions.items()}}


def median_seconds(calls: dict, repeats: int) -> dict:
    """Per name of `calls`, the median over `repeats` of seconds_per_call, the calls measured in turn each repeat."""
    times = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(seconds_per_call(call))
    return {name: statistics.median(found) for name, found in times.items()}


def latency(args) -> dict:
    torch.manual_seed(0)
    config = FastformerConfig(**args.size, max_position_embeddings=max(args.lengths))
    model = FastformerModel(config, add_pooling_layer=False).eval()
    torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        run = runtimes(model, Path(folder), args.threads)
        for length in args.lengths:
            inputs = {"input_ids": np.random.default_rng(0).integers(config.vocab_size, size=(1, length)),
                      "attention_mask": np.ones((1, length), np.int64)}  # fmt: skip
            expected = run["PyTorch eager"](inputs)[0]
            seconds = median_seconds({name: lambda call=call: call(inputs) for name, call in run.items()}, args.repeats)
            rows[length] = {name: {"ms": 1000 * seconds[name],
                                   "max_abs_difference": float(np.abs(call(inputs)[0] - expected).max())}
                            for name, call in run.items()}  # fmt: skip
            print(length, {name: f"{row['ms']:.1f} ms" for name, row in rows[length].items()}, flush=True)
    return {"config": args.size, "rows": rows}


def decoding(args) -> dict:
    """Greedy decoding of --new_tokens tokens, batch 1: PyTorch generate() against the ONNX Runtime loop
    (fastformer.export.onnx_greedy_generate), the same seq2seq model of MINILM_SIZE (6 + 6 layers), per source
    length; ms per generated token (the encoder's pass included, once), and the decoding state's bytes."""
    torch.manual_seed(0)
    # no end of sequence: every run generates --new_tokens tokens
    special = dict(pad_token_id=0, decoder_start_token_id=101, bos_token_id=101, eos_token_id=None)
    config = FastformerConfig(**args.size, **special, max_position_embeddings=max(args.source_lengths))
    model = FastformerForConditionalGeneration(config).eval()
    state_bytes = sum(tensor.numel() * tensor.element_size() for tensor in initial_state(config, 1))
    rows = {}
    with tempfile.TemporaryDirectory() as folder:
        export_seq2seq_onnx(model, folder)
        sessions = onnx_sessions(folder, args.threads)  # built once, outside the timing
        for length in args.source_lengths:
            input_ids = torch.from_numpy(np.random.default_rng(0).integers(1000, config.vocab_size, size=(1, length)))
            attention_mask = torch.ones_like(input_ids)
            calls = {
                "PyTorch generate": lambda: model.generate(input_ids, attention_mask=attention_mask, do_sample=False,
                                                           num_beams=1, max_new_tokens=args.new_tokens).numpy(),
                "ONNX Runtime loop": lambda: onnx_greedy_generate(sessions, config, input_ids.numpy(),
                                                                  attention_mask.numpy(), args.new_tokens),
            }  # fmt: skip
            tokens = {name: call() for name, call in calls.items()}
            seconds = median_seconds(calls, args.repeats)
            rows[length] = {name: 1000 * found / args.new_tokens for name, found in seconds.items()}
            rows[length]["same tokens"] = bool((tokens["PyTorch generate"] == tokens["ONNX Runtime loop"]).all())
            print(length, rows[length], flush=True)
    return {"state_bytes": state_bytes, "new_tokens": args.new_tokens, "rows": rows}


def accuracy(args) -> dict:
    model = AutoModelForSequenceClassification.from_pretrained(args.classifier).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.classifier)
    test = read_jsonl(args.test_file)
    texts = [row["text"] for row in test]
    labels = [model.config.label2id[str(row["label"])] for row in test]  # run_classification.py's labels: strings
    torch.set_num_threads(args.threads)
    found = {}
    with tempfile.TemporaryDirectory() as folder:
        for name, call in runtimes(model, Path(folder), args.threads).items():
            start, logits = time.perf_counter(), []
            for first in range(0, len(texts), 32):
                batch = tokenizer(texts[first : first + 32], truncation=True, max_length=args.max_length,
                                  padding=True, return_tensors="np", return_token_type_ids=False)  # fmt: skip
                logits.append(call({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]})[0])
            found[name] = {"logits": np.concatenate(logits), "ms": 1000 * (time.perf_counter() - start) / len(texts)}
    reference = found["PyTorch eager"]["logits"]
    rows = {
        name: {"accuracy": float((run["logits"].argmax(-1) == np.array(labels)).mean()),
               "agreement": float((run["logits"].argmax(-1) == reference.argmax(-1)).mean()),
               "max_abs_difference": float(np.abs(run["logits"] - reference).max()), "ms_per_text": run["ms"]}
        for name, run in found.items()
    }  # fmt: skip
    return {"classifier": relative(args.classifier), "texts": len(texts), "max_length": args.max_length, "rows": rows}


def fields(config: dict) -> str:
    return ", ".join(f"{name}={value}" for name, value in config.items())


def report(results) -> list[str]:
    """The measured part of DEPLOY.md from deploy.json's results."""
    latency = {int(length): row for length, row in results["latency"]["rows"].items()}
    lengths, names = list(latency), list(latency[next(iter(latency))])
    header = ["runtime", *(f"{length:,} tokens" for length in lengths)]
    speed = []
    for name in names:
        cells = [f"{latency[n][name]['ms']:.1f}" for n in lengths]
        if name != "PyTorch eager":
            cells = [f"{cell} ({latency[n]['PyTorch eager']['ms'] / latency[n][name]['ms']:.2f}x)"
                     for cell, n in zip(cells, lengths)]  # fmt: skip
        speed.append([name, *cells])
    differences = [[name, *(f"{latency[n][name]['max_abs_difference']:.1e}" for n in lengths)] for name in names[1:]]
    found = results["decoding"]
    decoded = [[f"{int(length):,}", f"{row['PyTorch generate']:.2f}", f"{row['ONNX Runtime loop']:.2f}",
                "yes" if row["same tokens"] else "no"] for length, row in found["rows"].items()]  # fmt: skip
    layers = results["latency"]["config"]["num_hidden_layers"]
    lines = [MEASURED, "", *results["header"], "", "### Encoder latency, batch 1 (ms per forward)", "",
             f"Model: FastformerModel, {fields(results['latency']['config'])}, random weights, no pooler; in"
             " parentheses: the speedup over PyTorch eager.", "", *table(header, speed), "",
             "Largest |difference| of last_hidden_state to PyTorch:", "", *table(header, differences), "",
             f"### Greedy decoding, batch 1 ({found['new_tokens']} new tokens, ms per token)", "",
             f"The seq2seq model of the same size (encoder and decoder {layers} layers, random weights); the time "
             "includes the source's encoder pass. The decoding state is "
             f"{found['state_bytes']:,} bytes per sequence, whatever the source and output lengths.", "",
             *table(["source tokens", "PyTorch generate", "ONNX Runtime loop", "same tokens"], decoded), "",
             "### int8 on a fine-tuned classifier", ""]  # fmt: skip
    found = results["accuracy"]
    if "rows" not in found:
        return [*lines, f"Not measured: no classifier at {found['classifier']} (run the README's Quickstart command "
                "first)."]  # fmt: skip
    rows = [[name, f"{row['accuracy']:.4f}", f"{row['agreement']:.2%}", f"{row['max_abs_difference']:.1e}",
             f"{row['ms_per_text']:.2f}"] for name, row in found["rows"].items()]  # fmt: skip
    return [*lines, f"{found['classifier']} on {found['texts']} test texts (max length {found['max_length']}, batches "
            "of 32, tokenization included in the time):", "",
            *table(["runtime", "accuracy", "agrees with PyTorch", "largest logit difference", "ms per text"],
                   rows)]  # fmt: skip


def write(markdown: Path, results: dict) -> None:
    """The person's text above MEASURED kept, the measured part below it rewritten."""
    text = markdown.read_text() if markdown.exists() else "# Deploying Fastformer\n\n"
    markdown.parent.mkdir(parents=True, exist_ok=True)
    written = text[: text.index(MEASURED)] if MEASURED in text else text
    markdown.write_text(written + "\n".join(report(results)) + "\n")


def main(argv=None):
    args = parse_args(argv)
    record = args.markdown.parent / "deploy.json"
    if args.report:
        write(args.markdown, read_json(record))
        return
    start = time.perf_counter()
    results = {"latency": latency(args), "decoding": decoding(args)}
    has_classifier = (args.classifier / "config.json").exists()
    results["accuracy"] = accuracy(args) if has_classifier else {"classifier": str(args.classifier)}
    results["header"] = run_lines(args.threads, time.perf_counter() - start)
    for part in ("latency", "decoding"):
        results[part]["rows"] = {str(length): row for length, row in results[part]["rows"].items()}
    write_json(record, results)
    write(args.markdown, results)


if __name__ == "__main__":
    main()
