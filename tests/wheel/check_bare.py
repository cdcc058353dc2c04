"""What a user who installed the wheel without extras (`pip install fastformer`) does, run by .ci/run from a folder
outside the repository with the wheel's environment before any extra is installed: import the package, build, save
and reload a tiny model, then each installed command: `--help` answers, and a run on tiny inputs either works or
stops at once with one line naming the extra to install, never a traceback. Exits non-zero with the failing step's
message."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
from importlib.metadata import distribution
from pathlib import Path

from installed_package import saved_classifier  # beside this script
from transformers import BertConfig, BertModel, BertTokenizerFast

import fastformer
from fastformer.cli import EXTRAS

saved_classifier()  # "classifier", which the commands below read

# a bare install: none of the modules that the commands need from an extra came with it
present = [name for modules in EXTRAS.values() for name in modules if importlib.util.find_spec(name) is not None]
assert not present, f"not a bare install: {present} can be imported"

words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"word{index}" for index in range(35))]
Path("vocab.txt").write_text("\n".join(words) + "\n")
BertTokenizerFast(vocab_file="vocab.txt").save_pretrained("tiny-bert")
bert = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37)
BertModel(bert).save_pretrained("tiny-bert")

# each installed command on tiny inputs; there is no Hub to push to here, so fastformer-push-to-hub is run to its
# refusal for want of a token (exit status 2), which it reaches only past its imports
RUNS = {
    "fastformer-convert": (["--model_name_or_path", "tiny-bert", "--output_dir", "converted"], None),
    "fastformer-export-onnx": (["--model_name_or_path", "classifier", "--output_dir", "onnx"], None),
    "fastformer-push-to-hub": (["--output_dir", "classifier", "--hub_model_id", "user/classifier"], "no Hub token"),
}
package = distribution("fastformer")
commands = sorted(entry.name for entry in package.entry_points if entry.group == "console_scripts")
assert commands == sorted(RUNS), f"the installed commands {commands} are not those this check runs: {sorted(RUNS)}"
extras = package.metadata.get_all("Provides-Extra")
env = {key: value for key, value in os.environ.items() if key != "HF_TOKEN"}
env["HF_HOME"] = tempfile.mkdtemp()  # no cached login either


def run(command: str, *args: str) -> subprocess.CompletedProcess:
    executable = Path(sys.executable).parent / command
    return subprocess.run([str(executable), *args], env=env, capture_output=True, text=True, timeout=600)


report = {}
for command, (args, refusal) in RUNS.items():
    helped = run(command, "--help")
    assert helped.returncode == 0 and "usage:" in helped.stdout, f"{command} --help:\n{helped.stdout}{helped.stderr}"
    ran = run(command, *args)
    output = f"{command} {' '.join(args)}: exit status {ran.returncode}\n{ran.stdout}{ran.stderr}"
    if refusal is not None:
        assert ran.returncode == 2 and refusal in ran.stderr and "Traceback" not in ran.stderr, output
        report[command] = "runs (refuses: no Hub token)"
    elif ran.returncode == 0:
        report[command] = "runs"
    else:
        needs = re.fullmatch(rf'{command} needs the "([\w-]+)" extra: pip install "fastformer\[\1\]"\n', ran.stderr)
        assert ran.returncode == 1 and needs and needs[1] in extras and not ran.stdout, output
        report[command] = ran.stderr.strip()
print(json.dumps({"package": fastformer.__file__, "commands": report}))
