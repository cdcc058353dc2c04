"""Checkpoints saved before the redesign (tests/legacy_checkpoints) load into today's classes with the same outputs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import (
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
)

from fastformer import FastformerSeq2SeqModel
from tests.legacy_checkpoints.make import ATTENTION_MASK, DECODER_IDS, INPUT_IDS

LEGACY = Path(__file__).parent / "legacy_checkpoints"
AUTO_CLASSES = {
    "encoder": AutoModel,
    "classifier": AutoModelForSequenceClassification,
    "masked_lm": AutoModelForMaskedLM,
    "seq2seq": AutoModelForSeq2SeqLM,
    "seq2seq_additive": AutoModelForSeq2SeqLM,
    "seq2seq_copy": AutoModelForSeq2SeqLM,
    "causal_lm": AutoModelForCausalLM,
}


@pytest.mark.parametrize("name", list(AUTO_CLASSES))
def test_legacy_checkpoint_gives_its_outputs(name):
    expected = load_file(LEGACY / name / "expected.safetensors")
    model = AUTO_CLASSES[name].from_pretrained(LEGACY / name).eval()
    decoder = {"decoder_input_ids": DECODER_IDS} if name.startswith("seq2seq") else {}
    # saved before segment embeddings, which start at zero where a checkpoint has none: any token types give the
    # outputs saved
    pair = torch.cat([torch.zeros_like(INPUT_IDS[:, :2]), torch.ones_like(INPUT_IDS[:, 2:])], dim=1)
    for token_types in ({}, {"token_type_ids": torch.zeros_like(INPUT_IDS)}, {"token_type_ids": pair}):
        with torch.no_grad():
            out = model(INPUT_IDS, attention_mask=ATTENTION_MASK, **decoder, **token_types)
        for key in ("logits", "last_hidden_state", "pooler_output"):
            if key in expected:
                torch.testing.assert_close(out[key], expected[key], atol=1e-5, rtol=0)
    if "greedy" in expected:
        greedy = model.generate(INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6, do_sample=False)
        beams = model.generate(INPUT_IDS, attention_mask=ATTENTION_MASK, max_new_tokens=6, num_beams=3, do_sample=False)
        assert greedy.tolist() == expected["greedy"].tolist()
        assert beams.tolist() == expected["beams"].tolist()


HUB_CODE = """
import sys
import torch
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, AutoModelForSequenceClassification

folder, name = sys.argv[1], sys.argv[2]
ids = torch.tensor({ids})
mask = (ids != 0).long()
expected = load_file(folder + "/expected.safetensors")
if name == "classifier":
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    logits = model(ids, attention_mask=mask).logits
else:
    model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
    logits = model(ids, attention_mask=mask, decoder_input_ids=torch.tensor({decoder_ids})).logits
    assert model.generate(ids, attention_mask=mask, max_new_tokens=6).tolist() == expected["greedy"].tolist()
assert "fastformer" not in sys.modules, "the package was imported"
torch.testing.assert_close(logits, expected["logits"], atol=1e-5, rtol=0)
"""


@pytest.mark.parametrize("name", ["classifier", "seq2seq_copy"])
def test_legacy_hub_code_loads_without_the_package(name, tmp_path):
    """The code saved inside an old checkpoint still runs with `trust_remote_code`, in an interpreter that never
    imported the package (where the package is imported, its own classes win)."""
    folder = shutil.copytree(LEGACY / name, tmp_path / name)
    for code in (LEGACY / "seq2seq_copy").glob("*.py"):  # the one copy of the Hub code kept, saved with every head
        shutil.copy(code, folder)
    script = HUB_CODE.format(ids=INPUT_IDS.tolist(), decoder_ids=DECODER_IDS.tolist())
    env = {**os.environ, "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(folder), name], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("name", ["seq2seq", "seq2seq_additive"])
def test_legacy_seq2seq_checkpoint_loads_into_the_bare_encoder_decoder(name):
    """`FastformerSeq2SeqModel` (as `BartModel` from a BART checkpoint) takes the encoder and the decoder of a head's
    checkpoint, and saves them back under their names there."""
    bare, info = FastformerSeq2SeqModel.from_pretrained(LEGACY / name, output_loading_info=True)
    head = AutoModelForSeq2SeqLM.from_pretrained(LEGACY / name)
    # the segment embeddings came after these checkpoints (they start at zero)
    assert info["missing_keys"] == {"encoder.embeddings.token_type_embeddings.weight"} and not info["mismatched_keys"]
    with torch.no_grad():
        states = bare.eval()(INPUT_IDS, attention_mask=ATTENTION_MASK, decoder_input_ids=DECODER_IDS)
        expected = head.eval().model(INPUT_IDS, attention_mask=ATTENTION_MASK, decoder_input_ids=DECODER_IDS)
    torch.testing.assert_close(states.last_hidden_state, expected.last_hidden_state, atol=0, rtol=0)
