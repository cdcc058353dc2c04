"""ONNX Runtime against PyTorch eager on the CPU, side by side in one run (docs/DEPLOY.md): the encoder's latency,
float32 and int8; greedy decoding on the exported seq2seq graphs; what int8 costs a fine-tuned classifier.

    python -m benchmarks.deploy                       # every part -> docs/deploy.json
    python -m benchmarks.deploy --lengths 128 512     # a quick check
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

from benchmarks import harness
from benchmarks.harness import DOCS, REPO
from fastformer import FastformerConfig, FastformerForConditionalGeneration, FastformerModel, export
from scripts.export_seq2seq_onnx import export_seq2seq_onnx, initial_state, onnx_greedy_generate, onnx_sessions

MINILM_SIZE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)
MINILM_SIZE.update(share_layers=False, share_query_value=False, hidden_dropout_prob=0.0)


def parse_args(argv=None):
    parser = harness.arguments(__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--calls", type=int, help="calls per timing (default: as many as fill about 0.5 s)")
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 4096])
    parser.add_argument("--source_lengths", type=int, nargs="+", default=[64, 1024], help="for decoding")
    parser.add_argument("--new_tokens", type=int, default=32, help="greedy tokens generated per source")
    parser.add_argument("--size", type=json.loads, default=MINILM_SIZE, help="config fields (JSON)")
    parser.add_argument("--classifier", type=Path, default=REPO / "runs" / "20newsgroups", help="left out if absent")
    parser.add_argument("--test_file", type=Path, default=REPO / "data" / "20newsgroups" / "test.jsonl")
    parser.add_argument("--max_length", type=int, default=256, help="the classifier's training length")
    parser.add_argument("--output", type=Path, default=DOCS / "deploy.json", help="the record; a CSV beside it")
    return parser.parse_args(argv)


def runtimes(model, folder: Path, threads: int) -> dict:
    """PyTorch eager, ONNX Runtime float32 and int8 for `model`: name -> (inputs as numpy) -> outputs as numpy."""
    float32 = export.export_onnx(model, folder / "model.onnx")
    int8 = export.quantize_int8(float32, folder / "model_quantized.onnx")
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1

    def eager(inputs):
        with torch.no_grad():
            return [model(**{name: torch.from_numpy(value) for name, value in inputs.items()})[0].numpy()]

    def onnx_runtime(path):
        session = onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        return lambda inputs: session.run(None, inputs)

    return {"PyTorch eager": eager, "ONNX Runtime fp32": onnx_runtime(float32), "ONNX Runtime int8": onnx_runtime(int8)}


def median_seconds(calls: dict, args) -> dict:
    """Per name of `calls`, the median over --repeats of seconds_per_call, the calls measured in turn each repeat."""
    times = [
        {name: harness.seconds_per_call(call, args.calls) for name, call in calls.items()} for _ in range(args.repeats)
    ]
    return {name: statistics.median(repeat[name] for repeat in times) for name in calls}


def latency(args) -> list[dict]:
    """Per length and runtime: the encoder's ms per forward (batch 1, no pooler), the speedup over PyTorch eager,
    the largest |difference| of last_hidden_state to PyTorch's."""
    torch.manual_seed(0)
    config = FastformerConfig(**args.size, max_position_embeddings=max(args.lengths))
    model = FastformerModel(config, add_pooling_layer=False).eval()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        run = runtimes(model, Path(folder), args.threads)
        for length in args.lengths:
            ids = np.random.default_rng(0).integers(config.vocab_size, size=(1, length))
            inputs = {"input_ids": ids, "attention_mask": np.ones((1, length), np.int64)}
            expected = run["PyTorch eager"](inputs)[0]
            seconds = median_seconds({name: lambda call=call: call(inputs) for name, call in run.items()}, args)
            for name, call in run.items():
                found = dict(ms=1e3 * seconds[name], speedup=seconds["PyTorch eager"] / seconds[name])
                difference = float(np.abs(call(inputs)[0] - expected).max())
                rows.append(dict(part="latency", tokens=length, runtime=name, **found, max_abs_difference=difference))
    return rows


def decoding(args) -> list[dict]:
    """Per source length and runtime: ms per generated token of greedy decoding, batch 1 (the encoder's pass
    included, once), whether both give the same tokens, and the decoding state's bytes per sequence."""
    torch.manual_seed(0)
    # no end of sequence: every run generates --new_tokens tokens
    special = dict(pad_token_id=0, decoder_start_token_id=101, bos_token_id=101, eos_token_id=None)
    config = FastformerConfig(**args.size, **special, max_position_embeddings=max(args.source_lengths))
    model = FastformerForConditionalGeneration(config).eval()
    state_bytes = sum(tensor.numel() * tensor.element_size() for tensor in initial_state(config, 1))
    rows, greedy = [], dict(do_sample=False, num_beams=1, max_new_tokens=args.new_tokens)
    with tempfile.TemporaryDirectory() as folder:
        export_seq2seq_onnx(model, folder)
        sessions = onnx_sessions(folder, args.threads)  # built once, outside the timing
        for length in args.source_lengths:
            ids = np.random.default_rng(0).integers(1000, config.vocab_size, size=(1, length))
            mask = np.ones_like(ids)
            pytorch = dict(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), **greedy)
            calls = {
                "PyTorch generate": lambda: model.generate(**pytorch).numpy(),
                "ONNX Runtime loop": lambda: onnx_greedy_generate(sessions, config, ids, mask, args.new_tokens),
            }
            tokens = [call() for call in calls.values()]
            same = bool((tokens[0] == tokens[1]).all())
            for name, seconds in median_seconds(calls, args).items():
                found = dict(ms_per_token=1e3 * seconds / args.new_tokens, same_tokens=same, state_bytes=state_bytes)
                rows.append(dict(part="decoding", tokens=length, runtime=name, **found))
    return rows


def accuracy(args) -> list[dict]:
    """Per runtime: the classifier's accuracy on --test_file, its agreement with PyTorch's predictions, the largest
    logit difference, and ms per text (batches of 32, tokenization included)."""
    model = AutoModelForSequenceClassification.from_pretrained(args.classifier).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.classifier)
    test = [json.loads(line) for line in args.test_file.read_text().splitlines()]
    texts = [row["text"] for row in test]
    labels = np.array([model.config.label2id[str(row["label"])] for row in test])  # run_classification's: strings
    encode, found = dict(truncation=True, max_length=args.max_length, padding=True), {}
    with tempfile.TemporaryDirectory() as folder:
        for name, call in runtimes(model, Path(folder), args.threads).items():
            start, logits = time.perf_counter(), []
            for first in range(0, len(texts), 32):
                batch = tokenizer(texts[first : first + 32], **encode, return_tensors="np", return_token_type_ids=False)
                logits.append(call(dict(batch))[0])
            found[name] = (np.concatenate(logits), 1e3 * (time.perf_counter() - start) / len(texts))
    reference, rows = found["PyTorch eager"][0], []
    for name, (logits, ms) in found.items():
        predictions = logits.argmax(-1)
        row = dict(part="accuracy", runtime=name, texts=len(texts), accuracy=float((predictions == labels).mean()))
        row["agreement"] = float((predictions == reference.argmax(-1)).mean())
        rows.append(dict(row, max_abs_difference=float(np.abs(logits - reference).max()), ms_per_text=ms))
    return rows


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    rows = latency(args) + decoding(args)
    if (args.classifier / "config.json").exists():
        rows += accuracy(args)
    settings = {name: value for name, value in vars(args).items() if name != "output"}
    for name in ("classifier", "test_file"):  # as a command run from the repository names them
        settings[name] = str(settings[name].resolve()).removeprefix(f"{REPO}/")
    harness.write_record(args.output, rows, settings, minutes=round((time.perf_counter() - start) / 60, 1))
    for part in dict.fromkeys(row["part"] for row in rows):  # a table each
        found = [{key: value for key, value in row.items() if key != "part"} for row in rows if row["part"] == part]
        print(harness.rows_table(found), end="\n\n")


if __name__ == "__main__":
    main()
