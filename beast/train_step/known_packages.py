"""The record, kept across runs, of the packages each kind of a `TrainStep` was built into
(beast/train_step/step.py, the CPU path): the run that traces and packages a kind writes
its packages under a key made before any trace, so that a later run of the same step
loads them at its first call with no trace and no eager step (`TrainStep._load_known`),
and says so in its start-up line (`TrainStep.plan`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

from torch import nn

from beast.train_step import package
from beast.train_step.flat import Used
from beast.train_step.interface import Kind, ParameterGroup
from beast.util.records import read_record, write_record

__all__ = ["PackageRecords", "Recorded"]

# The record of packages by their key before a trace (`TrainStep._load_known`).
_KNOWN_PACKAGES = "beast_packages.json"
# The packages each setup (a run's settings and beast's code, no batch yet) used, for the
# start-up line's account of the update's path (`TrainStep.plan`).
_SETUP_PACKAGES = "beast_setups.json"


class Recorded(NamedTuple):
    """What an earlier run recorded for a call of a kind of step (`PackageRecords.recorded`)."""

    names: list[str]  # each step's package, in the call's order: all still here
    reached: Any  # each step's reached parameters as written (None: all of them), unchecked


class PackageRecords:
    """The packages an earlier run of a step recorded, and this run's, for the next.

    Args:
        identity: what, besides beast's code and the step's arguments, the step's graph is
            made from (`TrainStep`'s `identity`), or None: the step is always traced, and
            nothing is recorded.
        loss: the step's loss; its name is part of the key.
        modules: every module the loss reads, by name; their descriptions are part of it.
        groups: the step's optimizers and what they train, by name; their kinds and
            settings are part of it.
        stepper: the learner's `Stepper`; its gradient-norm bound is part of it too (read
            when a key is made: a step that records nothing may have none).
    """

    def __init__(
        self,
        identity: str | None,
        loss: Callable[..., Any],
        modules: Mapping[str, nn.Module],
        groups: Mapping[str, ParameterGroup],
        stepper: Any,
    ) -> None:
        self.identity = identity
        self._loss = loss
        self._modules = modules
        self._groups = groups
        self._stepper = stepper
        # CPU: each traced kind's key before its trace, and its packages (`remember`).
        self._traced: dict[Kind, tuple[str, list[str]]] = {}

    def setup_key(self) -> str | None:
        """What names this setup's packages before any batch (`_SETUP_PACKAGES`): the
        known keys' parts (`_key`) but the kind and the arguments; None where steps are
        always traced (no `identity`)."""
        if self.identity is None:
            return None
        return package.known_step_key(repr(("setup", self.identity, *self._made_of())), ())

    def setup_packaged(self) -> bool:
        """Whether an earlier run of this setup left packages of its steps, all still here
        (its first step then loads one: `TrainStep._load_known`)."""
        key = self.setup_key()
        names = read_record(_SETUP_PACKAGES, key).get("packages") if key else None
        return bool(names) and all(
            isinstance(name, str) and os.path.exists(package.package_path(name)) for name in names
        )

    def recorded(
        self, kind: Kind, cut: tuple[str, ...] | None, arguments: tuple[Any, ...], parts: int
    ) -> Recorded | None:
        """The packages an earlier run recorded for a call of `kind` of `parts` steps on
        these arguments (`remember`), one a step and all still here; None where there are
        none."""
        known = read_record(_KNOWN_PACKAGES, self._key(kind, cut, arguments))
        names = known.get("packages")
        if not (
            isinstance(names, list)
            and len(names) == parts
            and all(isinstance(n, str) and os.path.exists(package.package_path(n)) for n in names)
        ):
            return None
        return Recorded(names, known.get("reached"))

    def traced(
        self, kind: Kind, cut: tuple[str, ...] | None, arguments: tuple[Any, ...], paths: list[str]
    ) -> None:
        """A call of `kind` on these arguments traced, each step's package to be at
        `paths`: its key, made now (before the packages are built), kept for `remember`."""
        self._traced[kind] = (self._key(kind, cut, arguments), paths)

    def remember(self, kind: Kind, used: Sequence[Used | None]) -> None:
        """A kind traced and packaged in this run: its packages under its key before the
        trace, with the parameters each step reaches (`used`), for the next run's
        `TrainStep._load_known`."""
        known = self._traced.pop(kind, None)
        if known is None:
            return
        key, paths = known
        # Each step's, in order (None: every parameter), and its package.
        reached = [None if u is None else u.params.tolist() for u in used]
        packages = [os.path.basename(path) for path in paths]
        write_record(_KNOWN_PACKAGES, key, {"packages": packages, "reached": reached})
        setup = self.setup_key()
        if setup is not None:
            names = read_record(_SETUP_PACKAGES, setup).get("packages")
            names = [n for n in names if isinstance(n, str) and n not in packages] if names else []
            write_record(_SETUP_PACKAGES, setup, {"packages": [*names, *dict.fromkeys(packages)]})

    def _key(self, kind: Kind, cut: tuple[str, ...] | None, arguments: tuple[Any, ...]) -> str:
        """`package.known_step_key` of this kind of step, cutting `cut` of its inputs, for
        these arguments."""
        assert self.identity is not None
        loss, modules, optimizers, clipping = self._made_of()
        identity = repr((self.identity, loss, kind, cut, modules, optimizers, clipping))
        return package.known_step_key(identity, arguments)

    def _made_of(self) -> tuple[Any, ...]:
        """What the step's graph is made from besides the run's settings and its
        arguments: the loss, the modules, the optimizers and the clipping."""
        loss = getattr(self._loss, "__qualname__", type(self._loss).__qualname__)
        modules = [(name, repr(module)) for name, module in self._modules.items()]
        optimizers = [
            (name, type(group.optimizer).__name__, sorted(group.optimizer.defaults.items()))
            for name, group in self._groups.items()
        ]
        return loss, modules, optimizers, self._stepper.grad_norm_clipping
