"""What both wheel checks do first (tests/wheel/check_bare.py, check_installed.py, beside this file, run as scripts):
the package comes from the environment's site-packages, and a tiny classifier saves and reloads with AutoModel."""

import sysconfig
from pathlib import Path

import torch
from transformers import AutoModel

import fastformer


def saved_classifier(folder: str = "classifier") -> fastformer.FastformerForSequenceClassification:
    """A tiny classifier saved to `folder`, after checking where the package comes from and that `folder` reloads."""
    # the package comes from the environment's site-packages, not from a source checkout
    assert Path(fastformer.__file__).is_relative_to(sysconfig.get_paths()["purelib"]), fastformer.__file__
    config = fastformer.FastformerConfig(vocab_size=40, hidden_size=32, num_attention_heads=4, intermediate_size=37)
    model = fastformer.FastformerForSequenceClassification(config).eval()
    model.save_pretrained(folder)
    reloaded = AutoModel.from_pretrained(folder).eval()
    ids = torch.randint(5, 40, (2, 9))
    with torch.no_grad():
        assert torch.equal(reloaded(ids).last_hidden_state, model.fastformer(ids).last_hidden_state)
    return model
