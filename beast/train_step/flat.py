"""The flat buffers that make one compiled graph possible (beast/train_step/__init__.py):
every trained parameter a view of one buffer, each target network's parameters views of
another laid out alike, and the optimizers' states in buffers of the same layout that
the optimizers' own state entries view, so that the modules, the eager optimizers,
checkpoints and the compiled step all read and write the same memory."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from beast.train_step.arithmetic import OptimizerRule, rule_for
from beast.train_step.interface import ParameterGroup, TargetNetwork

__all__ = ["Layout", "OptimizerState", "Used", "used_from_reached", "used_parameters"]


class Layout:
    """Trained parameters as views of one flat buffer, and every target network's
    parameters as views of another, each at the offset of the online parameter it
    follows."""

    def __init__(self, groups: Sequence[ParameterGroup], targets: Sequence[TargetNetwork]):
        params = [p for group in groups for p in group.parameters]
        if not params:
            raise ValueError("the optimizers train no parameter")
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter is in two optimizers")
        first = params[0]
        if any(p.dtype != first.dtype or p.device != first.device for p in params):
            raise ValueError("the trained parameters differ in dtype or device")
        self.params = params
        self.offsets: list[int] = []
        size = 0
        for p in params:
            self.offsets.append(size)
            size += p.numel()
        self.size = size
        self.flat = torch.zeros(size, dtype=first.dtype, device=first.device)
        _point_into(self.flat, params, self.offsets)
        # Each group's parameters (indices into params) and flat elements.
        self.group_params: dict[str, range] = {}
        self.group_slices: dict[str, slice] = {}
        start = 0
        for group in groups:
            stop = start + len(group.parameters)
            end = self.offsets[stop] if stop < len(params) else size
            self.group_params[group.name] = range(start, stop)
            self.group_slices[group.name] = slice(self.offsets[start], end)
            start = stop
        index = {id(p): i for i, p in enumerate(params)}
        self.target_flat = torch.zeros_like(self.flat)
        self.target_params: list[nn.Parameter] = []
        self.target_offsets: list[int] = []
        for pair in targets:
            online, target = list(pair.online.parameters()), list(pair.target.parameters())
            if len(online) != len(target):
                raise ValueError("a target network's parameters do not match its online one's")
            for mine, theirs in zip(target, online, strict=True):
                i = index.get(id(theirs))
                if i is None or mine.shape != theirs.shape:
                    raise ValueError("a target network follows a parameter no optimizer trains")
                self.target_params.append(mine)
                self.target_offsets.append(self.offsets[i])
        _point_into(self.target_flat, self.target_params, self.target_offsets)
        pairs = zip(self.target_params, self.target_offsets, strict=True)
        self.target_ranges = _merged([slice(o, o + p.numel()) for p, o in pairs])

    def views(self, flat: Tensor) -> list[Tensor]:
        """The trained parameters' views of `flat` (laid out as `self.flat`)."""
        return _views(flat, self.params, self.offsets)

    def target_views(self, target_flat: Tensor) -> list[Tensor]:
        return _views(target_flat, self.target_params, self.target_offsets)


def _views(flat: Tensor, params: Sequence[Tensor], offsets: Sequence[int]) -> list[Tensor]:
    return [
        flat[start : start + p.numel()].view(p.shape)
        for p, start in zip(params, offsets, strict=True)
    ]


@torch.no_grad()
def _point_into(flat: Tensor, params: Sequence[Tensor], offsets: Sequence[int]) -> None:
    """Copy each parameter into `flat` at its offset and make it a view of that place."""
    for p, view in zip(params, _views(flat, params, offsets), strict=True):
        view.copy_(p.detach())
        p.data = view


def _merged(ranges: Sequence[slice]) -> list[slice]:
    """Ranges that touch joined: a target network is one or a few ranges."""
    merged: list[slice] = []
    for r in sorted(ranges, key=lambda s: s.start):
        if merged and r.start <= merged[-1].stop:
            merged[-1] = slice(merged[-1].start, max(merged[-1].stop, r.stop))
        else:
            merged.append(r)
    return merged


class OptimizerState:
    """The optimizers' states in flat buffers laid out as the parameters and viewed by the
    optimizers' own state entries (eager steps, checkpoints and the compiled step share
    them), with each group's arithmetic for the compiled step (`rules`)."""

    def __init__(self, layout: Layout, groups: Sequence[ParameterGroup]) -> None:
        self.layout = layout
        self.groups = list(groups)
        device = layout.flat.device
        self.buffers: dict[str, Tensor] = {}
        # Per parameter, as torch keeps them (float32 scalars); the graph reads a group's
        # first, since a group's parameters step together.
        self.steps = torch.zeros(len(layout.params), dtype=torch.float32, device=device)
        self.rules: dict[str, OptimizerRule] = {}
        for group in groups:
            if len(group.optimizer.param_groups) != 1:
                raise ValueError(f"the {group.name} optimizer has several param groups")
            rule = self.rules[group.name] = rule_for(group.optimizer)
            for name in rule.state_names:
                self.buffers.setdefault(name, torch.zeros_like(layout.flat))
        self.adopt()

    @torch.no_grad()
    def adopt(self) -> None:
        """Move the optimizers' states into the flat buffers (at the start, and after a
        checkpoint's `load_state_dict` replaced them) and point the optimizers at them."""
        layout = self.layout
        for group in self.groups:
            optimizer, rule = group.optimizer, self.rules[group.name]
            for i in layout.group_params[group.name]:
                p, start = layout.params[i], layout.offsets[i]
                old = optimizer.state.get(p, {})
                step = old.get("step")
                self.steps[i] = float(step) if step is not None else 0.0
                # torch keeps RMSprop's (non-capturable) step on the CPU, Adam's fused one
                # with the parameter; a view of `steps` serves where they are together.
                entry: dict[str, Tensor] = {
                    "step": self.steps[i]
                    if not rule.step_count_on_cpu or p.device.type == "cpu"
                    else self.steps[i].cpu()
                }
                for name in rule.state_names:
                    view = self.buffers[name][start : start + p.numel()].view_as(p)
                    value = old.get(name)
                    view.copy_(value if value is not None else torch.zeros_like(p))
                    entry[name] = view
                optimizer.state[p] = entry


class Used(NamedTuple):
    """Which trained parameters a kind of step reaches: per flat element and per
    parameter (bool). None where all are."""

    elements: Tensor
    params: Tensor


def used_parameters(layout: Layout, indices: Sequence[int]) -> Used | None:
    """After an eager backward: which of the parameters at `indices` (the trained
    groups') received a gradient; None when all did."""
    reached = [True] * len(layout.params)
    for i in indices:
        reached[i] = layout.params[i].grad is not None
    return used_from_reached(layout, reached)


def used_from_reached(layout: Layout, reached: Sequence[bool]) -> Used | None:
    """`Used` from whether each of the layout's parameters is reached (a record of an
    earlier run's `Used.params`); None when all are. ValueError if `reached` is not one
    flag per parameter."""
    if len(reached) != len(layout.params):
        raise ValueError(f"{len(reached)} flags for {len(layout.params)} parameters")
    if all(reached):
        return None
    elements = torch.zeros(layout.size, dtype=torch.bool, device=layout.flat.device)
    for p, start, hit in zip(layout.params, layout.offsets, reached, strict=True):
        elements[start : start + p.numel()] = bool(hit)
    return Used(elements, torch.tensor([bool(hit) for hit in reached], device=layout.flat.device))
