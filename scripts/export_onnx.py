"""`fastformer-export-onnx` (fastformer/cli/export_onnx.py), as a script of this checkout: the same flags."""

from fastformer.cli.export_onnx import main

if __name__ == "__main__":
    main()
