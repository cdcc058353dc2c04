"""The tools installed as commands (pyproject.toml's [project.scripts]); `scripts/` runs the same from a checkout.

- `fastformer-convert`: fastformer/cli/convert_bert_to_fastformer.py (a BERT-family checkpoint as a Fastformer)
- `fastformer-export-onnx`: fastformer/cli/export_onnx.py (an encoder checkpoint as ONNX, checked on ONNX Runtime)
- `fastformer-push-to-hub`: fastformer/cli/push_to_hub.py (a finished output folder to the Hub)

Not imported by `import fastformer`: they need the extras their docstrings name.
"""
