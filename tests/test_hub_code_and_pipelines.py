"""Saved checkpoints as Hub code (`trust_remote_code=True`) and in transformers pipelines.

Once `fastformer` is imported, its registered classes win even with `trust_remote_code=True`, so remote-code
loading is checked in one fresh interpreter that cannot import the package; the in-process pipeline tests use the
registered classes.
"""

import functools
import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from fastformer import (
    FastformerCopyForConditionalGeneration,
    FastformerForCausalLM,
    FastformerForConditionalGeneration,
    FastformerForMaskedLM,
    FastformerForSequenceClassification,
    FastformerModel,
)

ID2LABEL = {0: "negative", 1: "neutral", 2: "positive"}
# two lengths, so the batch the models see carries padding
TEXTS = ["fastformer is fast.", "additive attention pools the whole sequence into one global query vector."]
GENERATION = {"max_new_tokens": 5, "do_sample": False}

# checkpoint folder -> class saved there
CHECKPOINT_CLASSES = {
    "model": FastformerModel,
    "classifier": FastformerForSequenceClassification,
    "masked_lm": FastformerForMaskedLM,
    "seq2seq": FastformerForConditionalGeneration,
    "seq2seq_copy": FastformerCopyForConditionalGeneration,  # with the copy head (fastformer/copy_head.py)
    "causal_lm": FastformerForCausalLM,
}
HEADS = [FastformerForSequenceClassification, FastformerForMaskedLM]
GENERATORS = ["seq2seq", "seq2seq_copy", "causal_lm"]
AUTO_CLASS_OF = {
    FastformerModel: "AutoModel",
    FastformerForSequenceClassification: "AutoModelForSequenceClassification",
    FastformerForMaskedLM: "AutoModelForMaskedLM",
    FastformerForConditionalGeneration: "AutoModelForSeq2SeqLM",
    FastformerCopyForConditionalGeneration: "AutoModelForSeq2SeqLM",
    FastformerForCausalLM: "AutoModelForCausalLM",
}
# (checkpoint folder, Auto class) pairs loaded as remote code: each checkpoint into its own class, and the bare
# encoder's checkpoint into every head
REMOTE_LOADS = [(folder, AUTO_CLASS_OF[cls]) for folder, cls in CHECKPOINT_CLASSES.items()] + [
    ("model", AUTO_CLASS_OF[head]) for head in HEADS
]

# Loads the saved checkpoints as Hub code (cwd: the folder holding them) and saves what it saw to remote_results.pt.
REMOTE_CODE_SCRIPT = textwrap.dedent(
    """
    import traceback

    import torch
    import transformers
    from transformers import pipeline

    job = torch.load("remote_job.pt")
    results = {}


    @torch.no_grad()
    def model_outputs(model, inputs, decoder_inputs):  # as model_outputs in the test module
        outputs = {name: value for name, value in model(**inputs, **decoder_inputs).items() if torch.is_tensor(value)}
        if model.base_model is model:
            return {"outputs": outputs}
        encoder = model.get_encoder() if model.config.is_encoder_decoder else model.base_model
        return {"outputs": outputs, "encoder_outputs": dict(encoder(**inputs))}


    def error_name(**kwargs):
        try:
            transformers.AutoModel.from_pretrained("model", **kwargs)
        except Exception as error:
            return type(error).__name__
        return None


    # before any remote class is loaded in this interpreter; stdin is closed, so the prompt gets no answer
    results["untrusted_error"] = {"default": error_name(), "False": error_name(trust_remote_code=False)}

    for folder, auto_name in job["loads"]:
        try:
            model = getattr(transformers, auto_name).from_pretrained(folder, trust_remote_code=True)
            loaded = {
                "class": type(model).__name__,
                "module": type(model).__module__,
                "training": model.training,
                **model_outputs(model, job["inputs"], job["decoder_inputs"].get(folder, {})),
            }
            if model.can_generate():
                with torch.no_grad():
                    loaded["generated"] = model.generate(**job["inputs"], **job["generation"])
            results[f"{folder}/{auto_name}"] = loaded
        except Exception:
            results[f"{folder}/{auto_name}"] = {"error": traceback.format_exc()}

    classify = pipeline("text-classification", model="classifier", trust_remote_code=True)
    results["text_classification"] = classify(job["texts"], top_k=None)
    torch.save(results, "remote_results.pt")
    """
)


@pytest.fixture(scope="module")
def tiny_config(tiny_config, tokenizer_fields):
    return functools.partial(tiny_config, **tokenizer_fields, intermediate_size=64, max_position_embeddings=2048)


def remote_load(remote_results, folder, auto_name):
    """What the fresh interpreter saw loading `folder` with `auto_name` as remote code."""
    loaded = remote_results[f"{folder}/{auto_name}"]
    assert "error" not in loaded, loaded.get("error")
    assert loaded["module"].startswith("transformers_modules.")
    return loaded


@torch.no_grad()
def model_outputs(model, inputs, decoder_inputs):
    """The model's outputs on the text `inputs` (with `decoder_inputs`) and those of the Fastformer encoder it is
    built on (its `base_model`) on the text alone, as dicts of tensors: the generation cache, an object, is left
    out. The bare encoder and the decoder-only causal LM are their own `base_model` and have "outputs" only.
    REMOTE_CODE_SCRIPT records the same."""
    outputs = {name: value for name, value in model(**inputs, **decoder_inputs).items() if torch.is_tensor(value)}
    if model.base_model is model:
        return {"outputs": outputs}
    encoder = model.get_encoder() if model.config.is_encoder_decoder else model.base_model
    return {"outputs": outputs, "encoder_outputs": dict(encoder(**inputs))}


def assert_same_tensors(actual, expected):
    assert actual.keys() == expected.keys()
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


@dataclass
class Checkpoints:
    path: Path  # a folder per entry of CHECKPOINT_CLASSES (weights, Hub code, tokenizer), and remote_job.pt
    models: dict  # folder -> the saved model, in eval mode
    inputs: dict  # a left-padded batch of TEXTS, also in remote_job.pt
    decoder_inputs: dict  # folder -> what its model takes besides `inputs`: fixed decoder input ids for seq2seq


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_config, tokenizer):
    path = tmp_path_factory.mktemp("checkpoints")
    # the generation heads start from [CLS] and stop at [SEP] (tokenizer_fields); with larger random weights than
    # the default, the untrained models generate tokens that depend on the input rather than repeating [CLS]
    generation = dict(initializer_range=0.2)
    config_overrides = {
        "classifier": {"id2label": ID2LABEL},
        "seq2seq": generation,
        "seq2seq_copy": generation,
        "causal_lm": generation,
    }
    torch.manual_seed(0)
    models = {}
    for folder, cls in CHECKPOINT_CLASSES.items():
        config = tiny_config(**config_overrides.get(folder, {}))
        models[folder] = cls(cls.config_class(**config.to_diff_dict())).eval()
        models[folder].save_pretrained(path / folder)
        tokenizer.save_pretrained(path / folder)
    # left padding, as decoder-only generation needs it (the encoders ignore padding on either side)
    inputs = dict(tokenizer(TEXTS, padding=True, padding_side="left", return_tensors="pt"))
    assert not inputs["attention_mask"].all()
    # fixed decoder inputs for the seq2seq forward: the first tokens of the other text
    decoder_input_ids = tokenizer(TEXTS[::-1], padding=True, return_tensors="pt").input_ids[:, :6]
    decoder_inputs = {folder: {"decoder_input_ids": decoder_input_ids} for folder in ("seq2seq", "seq2seq_copy")}
    job = dict(inputs=inputs, decoder_inputs=decoder_inputs, generation=GENERATION, texts=TEXTS, loads=REMOTE_LOADS)
    torch.save(job, path / "remote_job.pt")
    return Checkpoints(path, models, inputs, decoder_inputs)


@pytest.fixture(scope="module")
def remote_results(checkpoints, hide_fastformer, fresh_python):
    fresh_python(hide_fastformer + REMOTE_CODE_SCRIPT, checkpoints.path)
    return torch.load(checkpoints.path / "remote_results.pt")


def test_fresh_interpreter_imports_fastformer_unless_hidden(tmp_path, hide_fastformer, fresh_python, repo_root):
    # the control for hide_fastformer: without it the same interpreter setup finds this repo's package
    find = "import importlib.util; print(importlib.util.find_spec('fastformer').origin)"
    stdout = fresh_python(find, tmp_path)
    assert Path(stdout.strip()).parent == repo_root / "fastformer"
    fresh_python(hide_fastformer, tmp_path)


@pytest.mark.parametrize("folder", CHECKPOINT_CLASSES)
def test_saved_checkpoint_carries_code_for_every_head(checkpoints, repo_root, folder):
    saved = checkpoints.path / folder
    config = json.loads((saved / "config.json").read_text())
    heads = {
        "AutoConfig": "configuration_fastformer.FastformerConfig",
        "AutoModel": "modeling_fastformer.FastformerModel",
        "AutoModelForSequenceClassification": "modeling_fastformer.FastformerForSequenceClassification",
        "AutoModelForMaskedLM": "modeling_fastformer.FastformerForMaskedLM",
        "AutoModelForSeq2SeqLM": "modeling_fastformer.FastformerForConditionalGeneration",
        "AutoModelForCausalLM": "modeling_fastformer.FastformerForCausalLM",
    }
    modules = ("configuration_fastformer.py", "modeling_fastformer.py", "functional.py", "checks.py")
    if folder == "seq2seq_copy":  # the copy head's config and classes, in a module of their own
        heads["AutoConfig"] = "configuration_fastformer.FastformerCopyConfig"
        heads["AutoModelForSeq2SeqLM"] = "copy_head.FastformerCopyForConditionalGeneration"
        heads["AutoModelForCausalLM"] = "copy_head.FastformerCopyForCausalLM"
        modules += ("copy_head.py",)
    assert config["auto_map"] == heads
    for module in (*modules, "pipeline_fastformer.py"):
        assert (saved / module).read_text() == (repo_root / "fastformer" / module).read_text()


@pytest.mark.slow
def test_remote_code_needs_trust_remote_code(remote_results):
    # ValueError is transformers' refusal; an ImportError or OSError would mean loading broke for another reason
    assert remote_results["untrusted_error"] == {"default": "ValueError", "False": "ValueError"}


@pytest.mark.parametrize("folder", CHECKPOINT_CLASSES)
def test_remote_code_gives_the_same_outputs(checkpoints, remote_results, folder):
    model = checkpoints.models[folder]
    remote = remote_load(remote_results, folder, AUTO_CLASS_OF[type(model)])
    assert remote["class"] == type(model).__name__
    assert not remote["training"]
    expected = model_outputs(model, checkpoints.inputs, checkpoints.decoder_inputs.get(folder, {}))
    assert expected["outputs"]
    for part, tensors in expected.items():
        assert_same_tensors(remote[part], tensors)
    assert ("encoder_outputs" in remote) == ("encoder_outputs" in expected)


@pytest.mark.parametrize("folder", GENERATORS)
def test_remote_code_generates_the_same_tokens(checkpoints, remote_results, folder):
    model = checkpoints.models[folder]
    remote = remote_load(remote_results, folder, AUTO_CLASS_OF[type(model)])
    with torch.no_grad():
        expected = model.generate(**checkpoints.inputs, **GENERATION)
    prompt_length = 1 if model.config.is_encoder_decoder else checkpoints.inputs["input_ids"].shape[1]
    assert expected.shape == (len(TEXTS), prompt_length + GENERATION["max_new_tokens"])
    assert not torch.equal(expected[0, prompt_length:], expected[1, prompt_length:])  # the tokens follow the input
    assert torch.equal(remote["generated"], expected)


@pytest.mark.parametrize("head", HEADS, ids=lambda c: c.__name__)
def test_remote_code_loads_encoder_checkpoint_into_head(checkpoints, remote_results, head):
    remote = remote_load(remote_results, "model", AUTO_CLASS_OF[head])
    assert remote["class"] == head.__name__
    # the head itself is newly initialized; the encoder must be the saved one (the masked LM has no pooler)
    encoder_outputs = model_outputs(checkpoints.models["model"], checkpoints.inputs, {})["outputs"]
    if head is FastformerForMaskedLM:
        del encoder_outputs["pooler_output"]
    assert_same_tensors(remote["encoder_outputs"], encoder_outputs)


def test_text_classification_pipeline(checkpoints, tokenizer):
    classify = pipeline("text-classification", model=str(checkpoints.path / "classifier"))
    assert type(classify.model) is FastformerForSequenceClassification
    results = classify(TEXTS[0], top_k=None)
    assert sorted(result["label"] for result in results) == sorted(ID2LABEL.values())
    assert sum(result["score"] for result in results) == pytest.approx(1.0, abs=1e-6)
    with torch.no_grad():
        logits = checkpoints.models["classifier"](**tokenizer(TEXTS[0], return_tensors="pt")).logits[0]
    probabilities = {ID2LABEL[index]: score for index, score in enumerate(logits.softmax(-1).tolist())}
    assert {result["label"]: result["score"] for result in results} == pytest.approx(probabilities, abs=1e-6)


def test_feature_extraction_pipeline(checkpoints, tokenizer):
    model = checkpoints.models["model"]
    extract = pipeline("feature-extraction", model=str(checkpoints.path / "model"))
    assert type(extract.model) is FastformerModel
    features = torch.tensor(extract(TEXTS[1]))
    encoded = tokenizer(TEXTS[1], return_tensors="pt")
    assert features.shape == (1, encoded["input_ids"].shape[1], model.config.hidden_size)
    with torch.no_grad():
        assert torch.equal(features, model(**encoded).last_hidden_state)


def test_fill_mask_pipeline(checkpoints, tokenizer):
    fill_mask = pipeline("fill-mask", model=str(checkpoints.path / "masked_lm"))
    assert type(fill_mask.model) is FastformerForMaskedLM
    text = f"the global query is a {tokenizer.mask_token} of all queries."
    candidates = fill_mask(text, top_k=5)
    encoded = tokenizer(text, return_tensors="pt")
    mask_position = encoded["input_ids"][0].tolist().index(tokenizer.mask_token_id)
    with torch.no_grad():
        logits = checkpoints.models["masked_lm"](**encoded).logits[0, mask_position]
    best = logits.softmax(-1).topk(5)
    assert [candidate["token"] for candidate in candidates] == best.indices.tolist()
    assert [candidate["score"] for candidate in candidates] == pytest.approx(best.values.tolist(), rel=1e-6)


def test_remote_text_classification_pipeline_matches_in_process(checkpoints, remote_results):
    classify = pipeline("text-classification", model=str(checkpoints.path / "classifier"))
    assert remote_results["text_classification"] == classify(TEXTS, top_k=None)
