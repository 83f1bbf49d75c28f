"""examples/ runs as written: each script in a new interpreter from the checkout's root,
shortened by BEAST_EXAMPLE_STEPS, its runs in a private HOME (their default savedir);
the custom env's command line too; and the README's Python API snippet is
examples/python_api.py, character for character, so that the two cannot drift."""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Steps of each example's run: a few updates, seconds of training.
SHORT = "1000"
# Each example, the packages it needs beyond beast's, and a line of what it prints.
EXAMPLES = {
    "custom_env.py": ((), r"^evaluated: -?\d+\.\d\d \(at best 0\.92"),
    "custom_model.py": ((), r"^trained [\d,]+ steps: mean return \d+\.\d\d$"),
    "python_api.py": ((), r"/cartpole \d+ \d+\.\d+$"),
    "export_onnx.py": (
        ("onnx", "onnxruntime", "onnxscript"),
        r"^inputs \['obs'\] outputs \['action'\]$",
    ),
    "optuna_search.py": (("optuna",), r"^\[optuna\] best: trial0 "),
}


def run(argv: list[str], home) -> subprocess.CompletedProcess:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HOME=str(home), BEAST_EXAMPLE_STEPS=SHORT)
    return subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_example_runs_as_written(tmp_path, name):
    packages, printed = EXAMPLES[name]
    for package in packages:
        pytest.importorskip(package, reason=f"examples/{name} needs {package}")
    result = run([os.path.join("examples", name)], tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert re.search(printed, result.stdout, re.MULTILINE), result.stdout[-2000:]


def test_the_custom_env_trains_from_the_command_line(tmp_path):
    """custom_env.py's docstring's command: the class by its import path."""
    argv = ["monobeast.py", "--env", "examples.custom_env:Corridor", "--total_steps", SHORT]
    result = run([*argv, "--savedir", str(tmp_path), "--xpid", "corridor"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "corridor" / "model.tar").is_file()


def test_the_readme_shows_the_python_api_example_as_it_is():
    with open(os.path.join(ROOT, "README.md")) as f:
        section = f.read().split("## Python API", 1)[1]
    snippet = section.split("```python\n", 1)[1].split("```", 1)[0]
    with open(os.path.join(ROOT, "examples", "python_api.py")) as f:
        assert snippet == f.read()
