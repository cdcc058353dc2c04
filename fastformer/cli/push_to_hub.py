"""Publish a finished output folder (weights and Hub code, tokenizer, model card) to the Hugging Face Hub.

Creates the repo if missing and uploads the folder in one commit, without `IGNORE_PATTERNS`; files the repo has are
replaced, none deleted. The token: --hub_token, else `HF_TOKEN` or the cached login."""

import argparse
import sys
from pathlib import Path

from huggingface_hub import HfApi, get_token

IGNORE_PATTERNS = ["checkpoint-*", "runs/", "*.bin", "_*"]


def model_folder_problem(folder: Path):
    """Why `folder` is not a model folder to publish, or None."""
    if not folder.is_dir():
        return f"--output_dir {folder} is not a folder"
    if not (folder / "config.json").is_file():
        return f"{folder} is not a model folder: config.json is missing (write it with save_pretrained)"
    if not any(folder.glob("*.safetensors")):
        return f"{folder} is not a model folder: it has no *.safetensors weights (write them with save_pretrained)"
    return None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", type=Path, required=True, help="the folder to publish")
    parser.add_argument("--hub_model_id", required=True, help='the repo, "user/name" or "organization/name"')
    parser.add_argument(
        "--private", action="store_true", help="create the repo private (an existing one keeps its visibility)"
    )
    parser.add_argument("--commit_message", default="Upload Fastformer model", help="default: %(default)s")
    parser.add_argument("--hub_token", help="default: HF_TOKEN, or the cached login")
    parser.add_argument("--revision", help="the branch to commit to, made from main if missing (default: main)")
    args = parser.parse_args(argv)
    if args.hub_model_id.count("/") != 1:
        parser.error(f'--hub_model_id must be "user/name", got {args.hub_model_id!r}')
    problem = model_folder_problem(args.output_dir)
    if problem is not None:
        parser.error(problem)
    if args.hub_token is None and get_token() is None:
        parser.error("no Hub token: pass --hub_token, set HF_TOKEN or run `hf auth login`")
    return args


def main(argv=None):
    args = parse_args(argv)
    if not (args.output_dir / "README.md").is_file():
        print(f"warning: {args.output_dir} has no README.md, so the repo gets no model card", file=sys.stderr)
    api = HfApi(token=args.hub_token)
    # private=None leaves a new repo's visibility to the account's default
    api.create_repo(args.hub_model_id, private=args.private or None, exist_ok=True)
    if args.revision is not None:
        api.create_branch(args.hub_model_id, branch=args.revision, exist_ok=True)
    commit = api.upload_folder(
        repo_id=args.hub_model_id,
        folder_path=args.output_dir,
        commit_message=args.commit_message,
        revision=args.revision,
        ignore_patterns=IGNORE_PATTERNS,
    )
    print(f"Pushed {args.output_dir} to {args.hub_model_id}: {commit.commit_url}")


if __name__ == "__main__":
    main()
