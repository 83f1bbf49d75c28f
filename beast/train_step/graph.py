"""The compiled step's function (beast/train_step/__init__.py): one optimizer step of
one kind, or a block of steps one after another (each of its own kind), from the flat
buffers to the flat buffers, written for torch.compile to make one graph of: the
forward passes and losses, the gradients (torch.func over every trained parameter at
once), the norm and its clipping, the finiteness verdict, the optimizers' arithmetic,
the target updates and the priorities, with no host synchronisation inside. A skipped
step is a `where`, not a branch on the host."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils._pytree import tree_map

from beast.train_step.flat import Layout, OptimizerState, Used
from beast.train_step.interface import ParameterGroup, StepLoss, Train, split_block
from beast.train_step.optim import INITIAL_LR

__all__ = ["STOPS_EARLY", "GraphInputs", "Program", "StepGraph", "copied"]

# A block of steps (`StepGraph.step`) is taken whole: a loss that can stop them early is
# refused there.
STOPS_EARLY = (
    "a loss that can stop its steps early (StepLoss.proceed) takes them one call at a"
    " time, not in a block"
)
# torch.nn.utils.clip_grad_norm_'s guard against a zero norm.
_CLIP_EPSILON = 1e-6


class Program(nn.Module):
    """The algorithm's modules under one root, so that one `functional_call` puts the
    graph's views of the flat buffers in place of every trained and target parameter."""

    def __init__(self, modules: Mapping[str, nn.Module], loss: Callable[..., StepLoss]):
        super().__init__()
        self.parts = nn.ModuleDict(dict(modules))
        self._loss = loss

    def forward(self, inputs: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        return self._loss(inputs, train)


class StepGraph:
    """The compiled step over `program`'s loss, its parameters laid out by `layout`, its
    optimizers' states and arithmetic in `state`, gradients clipped to norm `clipping`
    where positive. torch.compile traces `step` with these as the bound object's
    attributes: Python constants of the graph, not inputs."""

    def __init__(
        self, program: Program, layout: Layout, state: OptimizerState, clipping: float
    ) -> None:
        self.program = program
        self.layout = layout
        self.state = state
        self.clipping = clipping
        # Every other tensor the modules hold (buffers such as a normaliser's statistics,
        # parameters no optimizer trains) is an input too, each distinct one once: the
        # graph reads their values at every step, never the values of the trace.
        stepped = {id(p) for p in (*layout.params, *layout.target_params)}
        held: dict[int, tuple[Tensor, list[str]]] = {}
        for name, tensor in (
            *program.named_parameters(remove_duplicate=False),
            *program.named_buffers(remove_duplicate=False),
        ):
            if id(tensor) not in stepped:
                held.setdefault(id(tensor), (tensor, []))[1].append(name)
        # Detached views of the same memory (a parameter's autograd flag is no input's).
        self.held = tuple(tensor.detach() for tensor, _ in held.values())
        self._held_names = tuple(tuple(names) for _, names in held.values())

    def step(
        self,
        flat: Tensor,
        target_flat: Tensor,
        steps: Tensor,
        buffers: dict[str, Tensor],
        lr: Tensor,
        tau: Tensor,
        held: tuple[Tensor, ...],
        inputs: dict[str, Tensor],
        *,
        trains: tuple[Train, ...],
        used: tuple[Used | None, ...],
        cut: tuple[str, ...] | None = None,
    ) -> tuple[Any, ...]:
        """`tau.shape[0]` steps, step i training the groups `trains[i]` names, one on each
        part of `inputs` (a block of that many batches, `split_block` cutting the inputs
        `cut` names; one part: `inputs` whole), each from the weights the one before left:
        writes `flat`, `target_flat`, `steps` and `buffers` in place, once, after the last.
        Returns, one entry per step: the losses, the gradient norms, their finiteness, the
        new weights' finiteness, whether the loss let the step proceed ([parts] tensors
        each), and the stats and priorities (lists). `lr` holds each group's rate, in the
        layout's group order; `held` the modules' other tensors (`self.held`). After step
        i the targets move `tau[i]` of the way (0 leaves them, without a second graph for
        the steps that do not average). Parameters step i does not reach (`used[i]`) are
        not stepped. A step that trains nothing (`trains[i]` empty: every step of its call)
        is the loss's forward pass alone: its outputs, a zero gradient norm, and nothing
        written."""
        parts = tau.shape[0]
        state = (flat, target_flat, steps, buffers)
        results = []
        for i, part in enumerate(split_block(inputs, parts, cut)):
            state, result = self._one(state, lr, tau[i], held, part, kind=trains[i], used=used[i])
            if parts > 1 and result[4] is not None:
                raise ValueError(STOPS_EARLY)
            results.append(result)
        if any(trains):
            new_flat, new_target, new_steps, new_buffers = state
            if self.layout.target_ranges:
                target_flat.copy_(new_target)
            flat.copy_(new_flat)
            steps.copy_(new_steps)
            for key, value in buffers.items():
                value.copy_(new_buffers[key])
        true = torch.ones((), dtype=torch.bool, device=flat.device)
        totals, norms, finite, weights_finite, proceed, stats, priorities = zip(
            *results, strict=True
        )
        return (
            torch.stack(totals),
            torch.stack(norms),
            torch.stack(finite),
            torch.stack(weights_finite),
            torch.stack([true if p is None else p for p in proceed]),
            list(stats),
            list(priorities),
        )

    def _one(
        self,
        buffers_in: tuple[Tensor, Tensor, Tensor, dict[str, Tensor]],
        lr: Tensor,
        tau: Tensor,
        held: tuple[Tensor, ...],
        inputs: dict[str, Tensor],
        *,
        kind: Train,
        used: Used | None,
    ) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        """One step of `kind` on `inputs` from the values of `step`'s buffers (flat,
        target_flat, steps, buffers), written nowhere: the buffers' new values, and the
        step's loss, gradient norm, finiteness, new weights' finiteness, `proceed` (None:
        the loss has none), stats and priorities."""
        flat, target_flat, steps, buffers = buffers_in
        program, layout, state, clipping = self.program, self.layout, self.state, self.clipping
        trained = {id(p): i for i, p in enumerate(layout.params)}
        followed = {id(p): i for i, p in enumerate(layout.target_params)}
        named = list(program.named_parameters(remove_duplicate=False))
        target_views = layout.target_views(target_flat)

        def forward(values: tuple[Tensor, ...]) -> StepLoss:
            swapped = {}
            for name, p in named:
                if id(p) in trained:
                    swapped[name] = values[trained[id(p)]]
                elif id(p) in followed:
                    swapped[name] = target_views[followed[id(p)]]
            for tensor, names in zip(held, self._held_names, strict=True):
                swapped.update(dict.fromkeys(names, tensor))
            return torch.func.functional_call(program, swapped, (inputs, kind), strict=False)

        if not kind:
            with torch.no_grad():
                out = forward(tuple(layout.views(flat)))
            true = torch.ones((), dtype=torch.bool, device=flat.device)
            outputs = (
                out.total.detach(),
                torch.zeros((), device=flat.device),
                true,
                true,
                out.proceed,
                out.stats,
                out.priorities,
            )
            return (flat, target_flat, steps, buffers), outputs

        def loss(values: tuple[Tensor, ...]) -> tuple[Tensor, dict[str, Any]]:
            out = forward(values)
            # torch.func's auxiliary outputs are tensors only: the absent ones left out.
            aux = {"stats": out.stats}
            if out.priorities is not None:
                aux["priorities"] = out.priorities
            if out.proceed is not None:
                aux["proceed"] = out.proceed
            return out.total, aux

        # Gradients per parameter, then one concatenation: differentiating through views
        # of the flat buffer would build a zero-padded flat gradient for every parameter.
        per_param, (total, aux) = torch.func.grad_and_value(loss, has_aux=True)(
            tuple(layout.views(flat))
        )
        grads = torch.cat([g.reshape(-1) for g in per_param])
        regions = [layout.group_slices[name] for name in kind]
        grad_norm = torch.stack([grads[r].square().sum() for r in regions]).sum().sqrt()
        finite = torch.isfinite(total.detach()) & torch.isfinite(grad_norm)
        proceed = aux.get("proceed")
        ok = finite if proceed is None else finite & proceed
        scale = (clipping / (grad_norm + _CLIP_EPSILON)).clamp(max=1.0) if clipping > 0 else 1.0
        rates = {name: i for i, name in enumerate(layout.group_slices)}
        # Each buffer is written once, whole, from its groups' new pieces in order: writes
        # into slices of a buffer would each become a pass over all of it.
        new_flat, new_buffers = [], {key: [] for key in buffers}
        new_steps = []
        for name, region in layout.group_slices.items():
            indices = layout.group_params[name]
            counts = steps[indices.start : indices.stop]
            pieces = {key: value[region] for key, value in buffers.items()}
            if name not in kind:
                new_flat.append(flat[region])
                new_steps.append(counts)
                for key, piece in pieces.items():
                    new_buffers[key].append(piece)
                continue
            gate = ok if used is None else ok & used.elements[region]
            param, moved = state.rules[name].step(
                flat[region], grads[region] * scale, pieces, counts[0] + 1.0, lr[rates[name]]
            )
            new_flat.append(torch.where(gate, param, flat[region]))
            for key, piece in pieces.items():
                new_buffers[key].append(
                    torch.where(gate, moved[key], piece) if key in moved else piece
                )
            stepped = ok if used is None else ok & used.params[indices.start : indices.stop]
            new_steps.append(torch.where(stepped, counts + 1.0, counts))
        updated = torch.cat(new_flat)
        new_target = target_flat
        if layout.target_ranges:
            new_target = _moved_targets(
                target_flat, updated, layout.target_ranges, tau, ok & (tau > 0)
            )
        # The new weights' check, as the eager path's `Stepper.check_weights` makes it (a
        # norm: inductor's boolean all() over a long buffer was measured to answer False
        # for finite weights now and then).
        weights_finite = torch.isfinite(torch.linalg.vector_norm(updated))
        new_state = (
            updated,
            new_target,
            torch.cat(new_steps),
            {key: torch.cat(value) for key, value in new_buffers.items()},
        )
        outputs = (
            total.detach(),
            grad_norm,
            finite,
            weights_finite,
            proceed,
            aux["stats"],
            aux.get("priorities"),
        )
        return new_state, outputs


class GraphInputs:
    """A compiled call's arguments besides its batch: the flat parameters and target
    parameters, the optimizers' state, each group's learning rate and each step's tau, at
    fixed addresses that each call's values are written into (a graph, and a CUDA graph's
    replay, read them there)."""

    def __init__(
        self,
        layout: Layout,
        state: OptimizerState,
        graph: StepGraph,
        groups: Sequence[ParameterGroup],
        stepper: Any,
    ) -> None:
        self.layout, self.state, self.graph = layout, state, graph
        self.groups, self.stepper = list(groups), stepper
        self.lr = torch.zeros(len(self.groups), device=layout.flat.device)
        self._lr_multiplier: float | None = None
        # Each step's tau, by the steps a call takes, and its values.
        self._taus: dict[int, Tensor] = {}
        self._tau_values: dict[int, tuple[float, ...]] = {}

    def arguments(
        self, inputs: Mapping[str, Tensor], *, copies: bool, parts: int = 1
    ) -> tuple[Any, ...]:
        """The graph's arguments for a call of `parts` steps on `inputs` (`copies`: of the
        state, for a dry run that must not write the run's)."""
        layout, state = self.layout, self.state
        arguments = (
            layout.flat,
            layout.target_flat,
            state.steps,
            state.buffers,
            self.lr,
            self._tau(parts),
            self.graph.held,
        )
        if copies:
            arguments = copied(arguments)
        return (*arguments, dict(inputs))

    def set(self, taus: tuple[float | None, ...]) -> None:
        """A call's values: each group's rate now (the stepper's schedule, also into the
        optimizers, which the eager path and the log read) and each step's tau (0: none)."""
        multiplier = self.stepper.lr_multiplier()
        if multiplier != self._lr_multiplier:
            rates = []
            for group in self.groups:
                for settings in group.optimizer.param_groups:
                    settings["lr"] = settings[INITIAL_LR] * multiplier
                rates.append(group.optimizer.param_groups[0]["lr"])
            self.lr.copy_(torch.tensor(rates))
            self._lr_multiplier = multiplier
        values = tuple(0.0 if tau is None else tau for tau in taus)
        if values != self._tau_values.get(len(values)):
            self._tau(len(values)).copy_(torch.tensor(values))
            self._tau_values[len(values)] = values

    def _tau(self, parts: int) -> Tensor:
        tau = self._taus.get(parts)
        if tau is None:
            tau = self._taus[parts] = torch.zeros(parts, device=self.layout.flat.device)
            self._tau_values[parts] = (0.0,) * parts
        return tau


def _moved_targets(
    target_flat: Tensor, online: Tensor, ranges: Sequence[slice], tau: Tensor, ok: Tensor
) -> Tensor:
    """The target buffer with its followed `ranges` moved `tau` of the way to `online`
    (lerp at 1 is the copy) where `ok`, the rest unchanged: one tensor, written once."""
    pieces, position = [], 0
    for region in ranges:
        if region.start > position:
            pieces.append(target_flat[position : region.start])
        old = target_flat[region]
        pieces.append(torch.where(ok, torch.lerp(old, online[region], tau), old))
        position = region.stop
    if position < target_flat.shape[0]:
        pieces.append(target_flat[position:])
    return torch.cat(pieces)


def copied(tree: Any) -> Any:
    """`tree` with every tensor in it cloned (a dry run's or a warm-up's arguments), each
    laid out as its original: a package runs its inputs with the strides it was traced
    with (a block's part is a strided view, beast/train_step/package.py `ChainedSteps`),
    and `clone` makes such a view contiguous."""
    return tree_map(lambda value: _copy(value) if isinstance(value, Tensor) else value, tree)


def _copy(value: Tensor) -> Tensor:
    if value.is_contiguous():
        return value.clone()
    copy = torch.empty_strided(value.size(), value.stride(), dtype=value.dtype, device=value.device)
    return copy.copy_(value)
