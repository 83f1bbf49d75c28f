"""The installed package cannot be shadowed (setup.py's package_dir): `import beast` in a
new interpreter gives the real package from a directory whose `beast` folder is the clone
itself (its parent, where a clone named beast sits) or an unrelated folder.

Without package_dir, `pip install -e .` installs an import hook that runs after Python's
path search, and that search takes such a folder for an empty namespace package:
`beast.train` is then an AttributeError. These tests check the install this suite runs
against, so they fail on such an install.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMPORT = "import beast; print(beast.__file__); beast.train; beast.export"


def import_beast_from(directory) -> subprocess.CompletedProcess:
    """`python -c IMPORT` run in `directory`, which the interpreter puts first on its path;
    PYTHONPATH is dropped, so only the install can find the package."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-c", IMPORT],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("beside", ["the_clone", "an_unrelated_folder"])
def test_import_beast_gives_the_package_beside_a_folder_named_beast(tmp_path, beside):
    if beside == "the_clone":
        # The clone's parent: a folder named beast that is this checkout.
        os.symlink(ROOT, tmp_path / "beast")
    else:
        (tmp_path / "beast").mkdir()
        (tmp_path / "beast" / "notes.txt").write_text("not a package\n")
    result = import_beast_from(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    origin = result.stdout.strip()
    assert origin.endswith(os.path.join("beast", "__init__.py"))
    assert not origin.startswith(str(tmp_path))
