"""Python objects as `module:qualname` strings, and back.

A run's env and model are flags: strings that reach every process of the run (actor
processes by forkserver pickling, Ray env servers and learners, the central inference
server), the checkpoint, meta.json and config.yaml, and that `--mode test` and a resume
read back. The Python API (beast/api.py) also takes the objects themselves, an env
factory or class, a model class or factory; `reference` turns one into the string under
which any process imports it again, or says in one line why there is none:

- a function or class defined at the top level of an importable module (a .py file on
  sys.path, an installed package): `package.module:name` (`package.module:Outer.Inner`
  for a class nested in a class);
- one defined in the script being run (`python train.py` or `python -m pkg.train`):
  `train:name`, the module the script is when imported. Actor processes import it by
  that name (forkserver re-imports the script in each of them anyway, as Ray workers do
  by that name, from the script's directory), so the script must keep its training code
  under `if __name__ == "__main__":`. In the script's own processes `import_module` maps
  that name to the running `__main__`, so the script is not executed a second time;
- a lambda, a closure, a class defined in a function, an object from an interactive
  session (a notebook cell, `python -c`) or from a script read from standard input
  (`python -`), or anything not found again under its name: refused, naming the object
  and saying where to define it. (A run from such a script that passes none trains:
  actor processes do not import the script, beast/acting/supervisor.py.)
"""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

__all__ = ["import_module", "reference", "script_module_name"]

_DEFINE_AT_MODULE_LEVEL = (
    "define it at module level in an importable module (a .py file on sys.path) and pass"
    " it from there"
)


def script_module_name() -> str | None:
    """The name under which the running `__main__` script imports as a module, or None (an
    interactive session, `python -c`, a file name that is no identifier, a script whose
    directory is not on sys.path)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name != "__main__":
        return spec.name  # python -m package.script
    path = getattr(main, "__file__", None)
    if not path:
        return None
    name = os.path.splitext(os.path.basename(path))[0]
    if not name.isidentifier():
        return None
    found = importlib.machinery.PathFinder.find_spec(name, sys.path)
    origin = getattr(found, "origin", None)
    if origin is None or not os.path.exists(origin) or not os.path.samefile(origin, path):
        return None
    return name


def import_module(name: str) -> ModuleType:
    """`importlib.import_module`, except that the name of the running script's module gives
    the running `__main__` (module docstring). ImportError as importlib raises it."""
    if name not in sys.modules and name == script_module_name():
        return sys.modules["__main__"]
    return importlib.import_module(name)


def _unimportable_main() -> str:
    """What the running `__main__` is, when `script_module_name` found no name for it."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path and not os.path.isfile(path):
        return "a script read from standard input (`python -`)"
    return "an interactive session or of a script that cannot be imported by its file name"


def _described(obj: Any) -> str:
    """The object's qualified name, or its type's: a repr can span lines (an nn.Module's)."""
    name = getattr(obj, "__qualname__", None)
    return name if isinstance(name, str) else f"a {type(obj).__name__} object"


def reference(obj: Any, argument: str) -> str:
    """`module:qualname` of a function or class that any process can import, for the API's
    `argument` (env=, model=); ConfigError, one line naming the object, otherwise."""
    # Imported here: beast.config imports the algorithm registry, which the env factory
    # (this module's other user, in every actor process) does not need.
    from beast.config import ConfigError

    qualname = getattr(obj, "__qualname__", None)
    module_name = getattr(obj, "__module__", None)
    shown = _described(obj)
    if not callable(obj) or not isinstance(qualname, str) or not isinstance(module_name, str):
        raise ConfigError(
            f"{argument}={shown} is not a function or a class; pass an import path string, or"
            f" {_DEFINE_AT_MODULE_LEVEL}"
        )
    if "<lambda>" in qualname:
        raise ConfigError(
            f"{argument}: a lambda ({qualname} in {module_name}) cannot be sent to actor"
            f" processes; write it as a function, {_DEFINE_AT_MODULE_LEVEL}"
        )
    if "<locals>" in qualname:
        raise ConfigError(
            f"{argument}: {qualname} (in {module_name}) is defined inside a function, so actor"
            f" processes cannot import it; {_DEFINE_AT_MODULE_LEVEL}"
        )
    module = sys.modules.get(module_name)
    if module_name == "__main__":
        module_name = script_module_name()
        if module_name is None:
            raise ConfigError(
                f"{argument}: {qualname} is defined in __main__ of {_unimportable_main()}, so"
                f" actor processes cannot import it; {_DEFINE_AT_MODULE_LEVEL}"
            )
    found: Any = module
    for part in qualname.split("."):
        found = getattr(found, part, None)
    if found is not obj:
        raise ConfigError(
            f"{argument}: {qualname} is not found again as {module_name}:{qualname} (replaced"
            f" or renamed after its definition?); {_DEFINE_AT_MODULE_LEVEL}"
        )
    return f"{module_name}:{qualname}"
