"""Fixtures shared by test modules: the repo's paths, the bundled tokenizer, tiny models, and a loopback Hub.

A module that needs other model defaults overrides `tiny_config` once, at module level, and `build` follows:

    @pytest.fixture(scope="module")
    def tiny_config(tiny_config):
        return functools.partial(tiny_config, vocab_size=61, initializer_range=0.2)
"""

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

# the suite runs offline, in this process too (huggingface_hub reads these when it is first imported)
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
# one thread per process, here and in the processes the tests start: pytest-xdist runs a worker per core, and
# OpenMP threads beyond the cores wait on each other (the tiny models' many small operations run 3-7x slower)
os.environ["OMP_NUM_THREADS"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoTokenizer, DynamicCache, EncoderDecoderCache  # noqa: E402

from fastformer import FastformerConfig, FastformerCopyConfig  # noqa: E402
from fastformer.configuration_fastformer import COPY_FIELDS  # noqa: E402
from tests.hub_server import serve  # noqa: E402  (a loopback server speaking the Hub's HTTP API)

torch.set_num_threads(1)  # OMP_NUM_THREADS reaches torch only if set before it is first imported

# the tiny models' defaults; a module whose assertions count with other numbers overrides `tiny_config`
TINY = dict(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=37,
    max_position_embeddings=64,
    hidden_dropout_prob=0.0,
    num_labels=3,
)


def empty_cache(model):
    """An empty generation cache for `model`, made as a transformers user makes one (as for BART or Qwen3-Next)."""
    if model.config.is_encoder_decoder:
        return EncoderDecoderCache(DynamicCache(config=model.config), DynamicCache(config=model.config))
    return DynamicCache(config=model.config)


@pytest.fixture(autouse=True)
def process_settings():
    """transformers' log verbosity and torch's thread count as they were before each test: a script or benchmark
    run in this process sets them (a benchmark silences warnings and takes --threads), and later tests read the
    warnings they expect and share the cores with the other workers."""
    verbosity, threads = transformers.logging.get_verbosity(), torch.get_num_threads()
    yield
    transformers.logging.set_verbosity(verbosity)
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def repo_root():
    return Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def tokenizer_path(repo_root):
    """The bundled bert-base-uncased tokenizer (the tests run offline)."""
    return repo_root / "data" / "tokenizers" / "bert-base-uncased"


@pytest.fixture(scope="session")
def tokenizer(tokenizer_path):
    return AutoTokenizer.from_pretrained(tokenizer_path)


@pytest.fixture(scope="session")
def tokenizer_fields(tokenizer):
    """The config fields that fit a model to `tokenizer`: its vocabulary, and its special ids as the generation
    heads use them (start from [CLS], stop at [SEP])."""
    return dict(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.cls_token_id,
        decoder_start_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id,
    )


# module scope, not session: a module's own `tiny_config` then reaches `build` too (and hypothesis takes them)
@pytest.fixture(scope="module")
def tiny_config():
    """tiny_config(**overrides) -> a FastformerConfig with the TINY defaults, a FastformerCopyConfig where
    `overrides` name one of its fields."""

    def make(**overrides):
        config_class = FastformerCopyConfig if COPY_FIELDS.keys() & overrides.keys() else FastformerConfig
        return config_class(**{**TINY, **overrides})

    return make


@pytest.fixture(scope="module")
def build(tiny_config):
    """build(model_class, seed=0, **overrides) -> a model of `tiny_config(**overrides)`, initialized after
    torch.manual_seed(seed), in eval mode."""

    def make(model_class, seed=0, **overrides):
        torch.manual_seed(seed)
        config = tiny_config(**overrides)
        if model_class.config_class is FastformerCopyConfig:
            config = FastformerCopyConfig(**config.to_diff_dict())
        return model_class(config).eval()

    return make


@pytest.fixture(scope="session")
def hub_server():
    """`with hub_server() as hub:` serves a fresh loopback Hub (tests/hub_server.py) for as long as the block runs;
    `hub.url` is the clients' endpoint, `hub.store` what it holds, `hub.client_env(hf_home)` a client's
    environment."""
    return serve


@pytest.fixture
def hub(hub_server):
    """A fresh loopback Hub for one test."""
    with hub_server() as running:
        yield running


@pytest.fixture(scope="session")
def hide_fastformer():
    """The first lines of a script for a fresh interpreter in which `import fastformer` fails, so that loading a
    checkpoint with `trust_remote_code=True` builds the model from the code the checkpoint carries (once
    `fastformer` is imported, its registered classes win). A meta path finder placed before all others makes the
    import fail however the package is installed: the editable install's finder in site-packages, a path entry,
    PYTHONPATH."""
    return textwrap.dedent(
        """
        import importlib.abc
        import sys


        class HideFastformer(importlib.abc.MetaPathFinder):
            def find_spec(self, fullname, path=None, target=None):
                if fullname.partition(".")[0] == "fastformer":
                    raise ModuleNotFoundError(f"No module named {fullname!r} (hidden by the test)", name=fullname)
                return None


        sys.meta_path.insert(0, HideFastformer())
        try:
            import fastformer
        except ModuleNotFoundError:
            pass
        else:
            raise AssertionError(f"fastformer is importable from {fastformer.__file__}")
        """
    )


@pytest.fixture(scope="session")
def fresh_python(repo_root):
    """fresh_python(script, cwd) runs `script` in a new interpreter in `cwd` and returns its stdout: offline,
    with the repo root on PYTHONPATH on purpose, so that only `hide_fastformer` (when the script starts with it)
    keeps the package out."""

    def run(script, cwd):
        env = dict(os.environ)
        env["HF_HUB_OFFLINE"] = "1"
        env["HF_MODULES_CACHE"] = str(cwd / "hf_modules")  # where remote code is copied and imported from
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), env.get("PYTHONPATH")]))
        process = subprocess.run(
            [sys.executable, "-c", script],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert process.returncode == 0, f"fresh interpreter failed:\n{process.stdout}\n{process.stderr}"
        return process.stdout

    return run


@pytest.fixture
def accelerate_launch():
    """accelerate_launch(config): `accelerate launch` with `config` through this interpreter (no `accelerate` on PATH
    needed), on a port free now: tests run in parallel would all take accelerate's default, 29500."""

    def command(config) -> tuple[str, ...]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        launch = (sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config))
        return (*launch, "--main_process_port", str(port))

    return command


def pytest_collection_modifyitems(items):
    """The modules with the most tests marked slow first, each module's tests in their order: pytest-xdist hands a
    free worker the next module, so the long ones start early instead of running alone at the end."""
    slow = {}
    for item in items:
        slow[item.path] = slow.get(item.path, 0) + (item.get_closest_marker("slow") is not None)
    items.sort(key=lambda item: -slow[item.path])
