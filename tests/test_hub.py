"""Publishing to the Hub and loading back, with the real huggingface_hub client against tests/hub_server.py (the
`hub` and `hub_server` fixtures).

huggingface_hub reads its endpoint (`HF_ENDPOINT`) at import, so every client that reaches the Hub runs in a
subprocess pointed at the loopback server (push_to_hub.py's refusals, which come before any request, run here).
Loading back happens in a fresh interpreter that cannot import fastformer (`hide_fastformer`), so the models are
built from the code their repos carry.
"""

import functools
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub
import pytest
import torch
from transformers import AutoTokenizer

from fastformer import FastformerForConditionalGeneration, FastformerForSequenceClassification
from fastformer.cli import push_to_hub

# two lengths, so the batch the models see carries padding
TEXTS = ["fastformer is fast.", "additive attention pools the whole sequence into one global query vector."]
GENERATION = {"max_new_tokens": 5, "do_sample": False}
MODEL_REPOS = ["user/classifier", "user/seq2seq"]  # pushed with the models' own push_to_hub
MODEL_CARD = "---\nlibrary_name: transformers\ntags:\n- fastformer\n---\n\n# A tiny Fastformer\n"
# what training leaves in an output folder, which push_to_hub.py must not upload
LEFTOVERS = {
    "checkpoint-10/model.safetensors": b"older weights",
    "runs/events.out.tfevents.0": b"tensorboard",
    "training_args.bin": b"pickle",
    "_scratch.txt": b"notes",
}

# Loads each (repo id, Auto class name) of job.pt's "loads" and the repo's tokenizer from the Hub (cwd: the folder
# holding job.pt) and saves what it saw to results.pt: the tokenized texts, and the logits or the generated tokens.
LOAD_SCRIPT = textwrap.dedent(
    """
    import torch
    import transformers

    job = torch.load("job.pt")
    results = {}
    for repo_id, auto_name in job["loads"].items():
        model = getattr(transformers, auto_name).from_pretrained(repo_id, trust_remote_code=True)
        # the repo's config is remote code, so loading its tokenizer needs the same trust
        tokenizer = transformers.AutoTokenizer.from_pretrained(repo_id, trust_remote_code=True)
        inputs = dict(tokenizer(job["texts"], padding=True, return_tensors="pt"))
        loaded = {"module": type(model).__module__, "training": model.training, "inputs": inputs}
        with torch.no_grad():
            if model.can_generate():
                loaded["generated"] = model.generate(**inputs, **job["generation"])
            else:
                loaded["logits"] = model(**inputs).logits
        results[repo_id] = loaded
    torch.save(results, "results.pt")
    """
)

# For each (folder, repo id, class name) in the JSON list argv[1]: loads the model saved in the folder with the
# package's class and pushes it, then its tokenizer, with their own push_to_hub.
# pushes in one interpreter (its imports take seconds): first `fastformer-push-to-hub` with the flags in argv[1],
# then each (folder, repo id, model class) of argv[2] by the model's and the tokenizer's own push_to_hub
MODEL_PUSH_SCRIPT = textwrap.dedent(
    """
    import json
    import sys

    import transformers

    import fastformer
    from fastformer.cli import push_to_hub

    push_to_hub.main(json.loads(sys.argv[1]))
    for folder, repo_id, class_name in json.loads(sys.argv[2]):
        getattr(fastformer, class_name).from_pretrained(folder).push_to_hub(repo_id)
        transformers.AutoTokenizer.from_pretrained(folder).push_to_hub(repo_id)
    """
)


# The huggingface_hub calls beyond a push and a download that tests/hub_server.py serves (cwd: the folder above
# files/, which holds a.txt, keep.txt, sub/b.txt, sub/deeper/c.txt); prints what they returned, as JSON.
API_SCRIPT = textwrap.dedent(
    """
    import json

    from huggingface_hub import HfApi, hf_hub_download


    def error_name(call):
        try:
            call()
        except Exception as error:
            return type(error).__name__


    api = HfApi()
    seen = {"url": api.create_repo("user/api")}
    seen["create_again"] = error_name(lambda: api.create_repo("user/api"))
    api.create_repo("user/api", exist_ok=True)
    api.create_repo("user/secret", private=True)
    api.upload_folder(repo_id="user/api", folder_path="files", commit_message="files")
    info = api.model_info("user/api")
    seen["info"] = {"sha": info.sha, "siblings": [sibling.rfilename for sibling in info.siblings]}
    seen["tree"] = [entry.path for entry in api.list_repo_tree("user/api")]
    seen["tree_recursive"] = [entry.path for entry in api.list_repo_tree("user/api", recursive=True)]
    seen["tree_sub"] = [entry.path for entry in api.list_repo_tree("user/api", "sub")]
    paths_info = api.get_paths_info("user/api", ["sub", "a.txt", "missing.txt"])
    seen["paths_info"] = [(type(entry).__name__, entry.path) for entry in paths_info]
    with open(hf_hub_download("user/api", "sub/deeper/c.txt")) as file:
        seen["download"] = file.read()
    seen["missing_file"] = error_name(lambda: hf_hub_download("user/api", "missing.txt"))
    seen["missing_repo"] = error_name(lambda: api.model_info("user/missing"))
    seen["missing_revision"] = error_name(lambda: api.model_info("user/api", revision="missing"))
    seen["anonymous_private"] = error_name(lambda: HfApi(token=False).model_info("user/secret"))
    api.delete_file("a.txt", "user/api")
    api.delete_folder("sub", "user/api")
    seen["commits"] = [commit.title for commit in api.list_repo_commits("user/api")]
    seen["whoami"] = api.whoami()["name"]
    print(json.dumps(seen))
    """
)


def run(args, cwd, env):
    """Runs `args` with stdin closed, so that a prompt gets no answer."""
    return subprocess.run(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)


def assert_succeeded(process):
    assert process.returncode == 0, f"{process.args} failed:\n{process.stdout}\n{process.stderr}"


@pytest.fixture(scope="module")
def push_folder(repo_root):
    def push(hub, tmp_path, folder, repo_id, *options, **client):
        """Runs scripts/push_to_hub.py against `hub`; `token=None` leaves HF_TOKEN unset."""
        script = repo_root / "scripts" / "push_to_hub.py"
        args = [sys.executable, str(script), "--output_dir", str(folder), "--hub_model_id", repo_id, *options]
        return run(args, tmp_path, hub.client_env(tmp_path / "hf_home", **client))

    return push


@pytest.fixture(scope="module")
def load_from_hub(repo_root, hide_fastformer):
    def load(hub, path, loads):
        """What a fresh interpreter without fastformer gets loading each repo of `loads` (repo id -> Auto class
        name) from `hub` as remote code, in `path`."""
        torch.save({"loads": loads, "texts": TEXTS, "generation": GENERATION}, path / "job.pt")
        env = hub.client_env(path / "hf_home")
        # the repo root on PYTHONPATH on purpose: only hide_fastformer keeps the package out
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")]))
        assert_succeeded(run([sys.executable, "-c", hide_fastformer + LOAD_SCRIPT], path, env))
        assert hub.store.unknown_routes == []
        results = torch.load(path / "results.pt")
        assert results.keys() == loads.keys()
        for loaded in results.values():
            assert loaded["module"].startswith("transformers_modules.")
            assert not loaded["training"]
        return results

    return load


def folder_files(folder):
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.fixture(scope="module")
def tiny_config(tiny_config, tokenizer_fields):
    return functools.partial(tiny_config, **tokenizer_fields, intermediate_size=64, max_position_embeddings=2048)


def save_classifier(folder, build, tokenizer):
    """A tiny classifier saved in `folder` as training leaves it: weights, Hub code, tokenizer, model card."""
    model = build(FastformerForSequenceClassification)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(MODEL_CARD)
    return model


def save_seq2seq(folder, build, tokenizer):
    # starts from [CLS], stops at [SEP] (tokenizer_fields); larger random weights make the tokens depend on the input
    model = build(FastformerForConditionalGeneration, initializer_range=0.2)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


@torch.no_grad()
def local_outputs(model, tokenizer):
    """What LOAD_SCRIPT records: the tokenized texts, and the logits or the generated tokens."""
    inputs = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    if model.can_generate():
        return inputs, {"generated": model.generate(**inputs, **GENERATION)}
    return inputs, {"logits": model(**inputs).logits}


def assert_same_outputs(loaded, model, tokenizer):
    inputs, outputs = local_outputs(model, tokenizer)
    assert loaded["inputs"].keys() == inputs.keys()
    for name, tensor in inputs.items():
        assert torch.equal(loaded["inputs"][name], tensor), name
    for name, tensor in outputs.items():
        assert torch.equal(loaded[name], tensor), name


@pytest.fixture
def classifier(tmp_path, build, tokenizer):
    folder = tmp_path / "classifier"
    return save_classifier(folder, build, tokenizer), folder


def test_server_answers_the_client_like_the_hub(hub, tmp_path):
    for name in ["a.txt", "keep.txt", "sub/b.txt", "sub/deeper/c.txt"]:
        (tmp_path / "files" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "files" / name).write_text(f"content of {name}")
    process = run([sys.executable, "-c", API_SCRIPT], tmp_path, hub.client_env(tmp_path / "hf_home"))
    assert_succeeded(process)
    seen = json.loads(process.stdout)

    assert seen["url"] == f"{hub.url}/user/api"
    assert seen["create_again"] == "HfHubHTTPError"  # 409, which exist_ok=True lets pass
    files_commit = hub.store.history("user/api")[1]
    assert seen["info"] == {"sha": files_commit.oid, "siblings": sorted(files_commit.files)}
    assert seen["tree"] == [".gitattributes", "a.txt", "keep.txt", "sub"]
    assert seen["tree_recursive"] == [
        ".gitattributes",
        "a.txt",
        "keep.txt",
        "sub",
        "sub/b.txt",
        "sub/deeper",
        "sub/deeper/c.txt",
    ]
    assert seen["tree_sub"] == ["sub/b.txt", "sub/deeper"]
    assert seen["paths_info"] == [["RepoFolder", "sub"], ["RepoFile", "a.txt"]]
    assert seen["download"] == "content of sub/deeper/c.txt"
    assert seen["missing_file"] == "RemoteEntryNotFoundError"
    assert seen["missing_repo"] == "RepositoryNotFoundError"
    assert seen["missing_revision"] == "RevisionNotFoundError"
    assert seen["anonymous_private"] == "RepositoryNotFoundError"
    assert seen["commits"] == [
        "Delete folder sub with huggingface_hub",
        "Delete a.txt with huggingface_hub",
        "files",
        "initial commit",
    ]
    assert hub.store.files("user/api").keys() == {".gitattributes", "keep.txt"}
    assert seen["whoami"] == "user"
    assert hub.store.unknown_routes == []


# fastformer-push-to-hub twice in one interpreter (its imports take seconds): the folder of argv[1] as it is, then
# with README.md holding argv[2] and eval_results.json deleted, committed as "Update the card"
PUSH_TWICE_SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from fastformer.cli import push_to_hub

    folder = Path(sys.argv[1])
    flags = ["--output_dir", str(folder), "--hub_model_id", "user/classifier"]
    push_to_hub.main(flags)
    (folder / "README.md").write_text(sys.argv[2])
    (folder / "eval_results.json").unlink()  # gone from the folder, still in the repo
    push_to_hub.main([*flags, "--commit_message", "Update the card"])
    """
)


@pytest.mark.slow
def test_pushing_again_adds_a_commit_and_deletes_nothing(hub, tmp_path, classifier):
    _, folder = classifier
    (folder / "eval_results.json").write_text(json.dumps({"eval_accuracy": 0.5}))
    new_card = MODEL_CARD + "\nEvaluated on 20newsgroups.\n"
    env = hub.client_env(tmp_path / "hf_home")
    process = run([sys.executable, "-c", PUSH_TWICE_SCRIPT, str(folder), new_card], tmp_path, env)
    assert_succeeded(process)

    history = hub.store.history("user/classifier")
    # the Hub's own first commit, then one per push
    assert [commit.title for commit in history] == ["initial commit", "Upload Fastformer model", "Update the card"]
    first = history[1]
    assert history[2].parent == first.oid
    assert first.files["README.md"] == MODEL_CARD.encode()
    assert "eval_results.json" in first.files
    assert dict(history[2].files) == {**first.files, "README.md": new_card.encode()}


def refusal(folder, monkeypatch, capsys, token="hf_test"):
    """What push_to_hub.py exits with and prints to stderr for `folder`, run in this process: a refusal comes
    before any request (the suite is offline here, so a request would fail otherwise)."""
    if token is None:  # neither HF_TOKEN nor a cached login
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(folder.parent / "no-token"))
    else:
        monkeypatch.setenv("HF_TOKEN", token)
    with pytest.raises(SystemExit) as exit_:
        push_to_hub.main(["--output_dir", str(folder), "--hub_model_id", "user/classifier"])
    return exit_.value.code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("missing", "message"), [("config.json", "config.json"), ("model.safetensors", "*.safetensors")]
)
def test_push_refuses_a_folder_that_is_not_a_model(classifier, missing, message, monkeypatch, capsys):
    _, folder = classifier
    (folder / missing).unlink()
    code, stderr = refusal(folder, monkeypatch, capsys)
    assert code != 0
    assert f"{folder} is not a model folder" in stderr and message in stderr


def test_push_refuses_without_a_token(classifier, monkeypatch, capsys):
    _, folder = classifier
    code, stderr = refusal(folder, monkeypatch, capsys, token=None)
    assert code != 0 and "no Hub token" in stderr


@pytest.mark.slow
def test_push_to_a_private_repo_branch_with_a_token_flag(push_folder, hub, tmp_path, classifier):
    _, folder = classifier
    (folder / "README.md").unlink()
    options = ["--private", "--revision", "dev", "--hub_token", "hf_flag"]
    process = push_folder(hub, tmp_path, folder, "user/private", *options, token=None)
    assert_succeeded(process)
    assert "has no README.md" in process.stderr
    repo = hub.store.repos["user/private"]
    assert repo.private
    assert {request.token for request in hub.store.requests} == {"hf_flag"}
    assert [commit.title for commit in repo.history("dev")] == ["initial commit", "Upload Fastformer model"]
    assert "config.json" in repo.resolve("dev").files
    assert [commit.title for commit in repo.history("main")] == ["initial commit"]


@dataclass
class Published:
    hub: object  # the running loopback Hub serving the repos below
    path: Path  # a folder per repo, as pushed: "script", "classifier", "seq2seq", and "out" (user/trained)
    models: dict  # repo id -> the model pushed there, in eval mode
    script_stdout: str  # what the push subprocess printed, fastformer-push-to-hub first
    loaded: dict  # repo id -> what a fresh interpreter without fastformer loaded from there (LOAD_SCRIPT)


def training_push(hub, path, repo_root):
    """run_classification.py --push_to_hub, a few steps of a tiny model, from `path` / "out" to user/trained."""
    data = repo_root / "data" / "20newsgroups"
    args = [sys.executable, str(repo_root / "scripts" / "run_classification.py"), "--output_dir", str(path / "out")]
    args += ["--do_train", "--do_eval", "--train_file", str(data / "train.jsonl"), "--validation_file"]
    args += [str(data / "test.jsonl"), "--max_train_samples", "32", "--max_eval_samples", "16"]
    args += ["--max_seq_length", "64", "--max_steps", "2", "--report_to", "none", "--use_cpu"]
    args += ["--config_overrides", "hidden_size=32,num_attention_heads=4,intermediate_size=64"]
    args += ["--save_strategy", "no", "--push_to_hub", "--hub_model_id", "user/trained"]
    env = {**hub.client_env(path / "hf_home"), "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    assert_succeeded(run(args, repo_root, env))


@pytest.fixture(scope="module")
def published(tmp_path_factory, hub_server, push_folder, load_from_hub, build, tokenizer, repo_root):
    """A classifier's output folder, with training leftovers, pushed by fastformer-push-to-hub to user/script; a
    classifier and a seq2seq model pushed, each with its tokenizer, by their own push_to_hub (the same subprocess)
    to user/classifier and user/seq2seq; a classifier trained and pushed by run_classification.py --push_to_hub to
    user/trained. All four loaded back as remote code in one fresh interpreter."""
    path = tmp_path_factory.mktemp("published")
    models = {
        "user/script": save_classifier(path / "script", build, tokenizer),
        "user/classifier": save_classifier(path / "classifier", build, tokenizer),
        "user/seq2seq": save_seq2seq(path / "seq2seq", build, tokenizer),
    }
    for name, content in LEFTOVERS.items():
        (path / "script" / name).parent.mkdir(exist_ok=True)
        (path / "script" / name).write_bytes(content)
    with hub_server() as hub:
        flags = ["--output_dir", str(path / "script"), "--hub_model_id", "user/script"]
        pushes = [(str(path / name.split("/")[1]), name, type(models[name]).__name__) for name in MODEL_REPOS]
        process = run(
            [sys.executable, "-c", MODEL_PUSH_SCRIPT, json.dumps(flags), json.dumps(pushes)],
            path,
            hub.client_env(path / "hf_home"),
        )
        assert_succeeded(process)
        training_push(hub, path, repo_root)
        auto_classes = {
            "user/script": "AutoModelForSequenceClassification",
            "user/classifier": "AutoModelForSequenceClassification",
            "user/seq2seq": "AutoModelForSeq2SeqLM",
            "user/trained": "AutoModelForSequenceClassification",
        }
        loaded = load_from_hub(hub, path, auto_classes)
        yield Published(hub, path, models, process.stdout, loaded)


@pytest.mark.slow
def test_push_script_uploads_the_folder_without_training_leftovers(published):
    store = published.hub.store
    head = store.history("user/script")[-1]
    assert f"{published.hub.url}/user/script/commit/{head.oid}" in published.script_stdout
    assert head.title == "Upload Fastformer model"
    assert not store.repos["user/script"].private
    files = folder_files(published.path / "script")
    assert LEFTOVERS.keys() < files.keys()
    assert {"README.md", "config.json", "model.safetensors", "modeling_fastformer.py", "tokenizer.json"} < files.keys()
    kept = {name: content for name, content in files.items() if name not in LEFTOVERS}
    gitattributes = store.history("user/script")[0].files[".gitattributes"]  # the Hub's own, from the first commit
    assert dict(head.files) == {**kept, ".gitattributes": gitattributes}


@pytest.mark.slow
@pytest.mark.parametrize("repo_id", MODEL_REPOS)
def test_model_push_to_hub_commits_model_then_tokenizer(published, repo_id):
    model = published.models[repo_id]
    history = published.hub.store.history(repo_id)
    # transformers' default messages, after the Hub's own first commit
    titles = ["initial commit", f"Upload {type(model).__name__}", "Upload tokenizer"]
    assert [commit.title for commit in history] == titles
    files = history[-1].files
    assert {"README.md", "config.json", "model.safetensors", "modeling_fastformer.py", "tokenizer.json"} < files.keys()
    assert files.keys() > history[1].files.keys()  # the tokenizer's push kept the model's files


@pytest.mark.slow
@pytest.mark.parametrize("repo_id", ["user/script", *MODEL_REPOS])
def test_published_model_loads_as_remote_code_with_the_same_outputs(published, tokenizer, repo_id):
    assert_same_outputs(published.loaded[repo_id], published.models[repo_id], tokenizer)


@pytest.mark.slow
def test_seq2seq_push_to_hub_generates_input_dependent_tokens_and_ships_its_pipeline(published, repo_root):
    generated = published.loaded["user/seq2seq"]["generated"]
    assert generated.shape == (len(TEXTS), 1 + GENERATION["max_new_tokens"])
    assert not torch.equal(generated[0, 1:], generated[1, 1:])  # the tokens follow the input
    files = published.hub.store.files("user/seq2seq")
    module = json.loads(files["config.json"])["custom_pipelines"]["summarization"]["impl"].split(".")[0]
    assert files[f"{module}.py"] == (repo_root / "fastformer" / f"{module}.py").read_bytes()


@pytest.mark.slow
def test_training_script_pushes_through_trainer_with_its_model_card(published):
    """run_classification.py --push_to_hub: the repo gets the weights, the code and the Fastformer model card,
    whose model-index holds exactly the evaluation results, and loads as remote code elsewhere."""
    files = published.hub.store.files("user/trained", "main")
    assert {"config.json", "model.safetensors", "modeling_fastformer.py", "tokenizer.json", "README.md"} <= files.keys()
    card = files["README.md"].decode()
    assert "fastformer" in card and "trust_remote_code=True" in card and "Fine-tuned" not in card.split("---")[1]
    output = published.path / "out"
    metrics = json.loads((output / "eval_results.json").read_text())
    for key in ("eval_accuracy", "eval_f1_macro", "eval_loss"):
        assert f"value: {metrics[key]}" in card, key
    trained = FastformerForSequenceClassification.from_pretrained(output).eval()
    assert_same_outputs(published.loaded["user/trained"], trained, AutoTokenizer.from_pretrained(output))
