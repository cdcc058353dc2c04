"""`fastformer-push-to-hub` (fastformer/cli/push_to_hub.py), as a script of this checkout: the same flags."""

from fastformer.cli.push_to_hub import main

if __name__ == "__main__":
    main()
