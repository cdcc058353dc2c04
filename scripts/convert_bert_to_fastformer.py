"""`fastformer-convert` (fastformer/cli/convert_bert_to_fastformer.py), as a script of this checkout: the same flags."""

from fastformer.cli.convert_bert_to_fastformer import main

if __name__ == "__main__":
    main()
