"""What a user who installed the wheel does, run by .ci/run from a folder outside the repository with the wheel's
environment: import the package, save and reload a model, write its model card, convert a tiny BERT with the
installed `fastformer-convert` and find the converted model's card. Exits non-zero with the failing step's message."""

import json
import subprocess
import sys
from pathlib import Path

from installed_package import saved_classifier  # beside this script
from transformers import AutoModel, BertConfig, BertModel, BertTokenizerFast

import fastformer
from fastformer.model_card import write_model_card

model = saved_classifier()

write_model_card(
    "classifier",
    model=model,
    task="text-classification",
    dataset="user/data",
    metrics={"eval_accuracy": 0.5},
    hyperparameters={"learning_rate": 1e-3},
)  # the templates in the wheel
assert "FastformerForSequenceClassification" in Path("classifier/README.md").read_text()

words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"word{index}" for index in range(35))]
Path("vocab.txt").write_text("\n".join(words) + "\n")
BertTokenizerFast(vocab_file="vocab.txt").save_pretrained("tiny-bert")
bert = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
BertModel(bert).save_pretrained("tiny-bert")
command = Path(sys.executable).parent / "fastformer-convert"
subprocess.run([str(command), "--model_name_or_path", "tiny-bert", "--output_dir", "converted"], check=True)
card = Path("converted/README.md").read_text()
assert "Fastformer" in card, card[:500]
converted = AutoModel.from_pretrained("converted")
assert type(converted).__name__ == "FastformerModel"
print(json.dumps({"package": fastformer.__file__, "card_lines": len(card.splitlines()), "converted": "ok"}))
