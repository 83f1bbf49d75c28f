"""One optimizer step for every algorithm: eager, or compiled as one graph.

An algorithm states its update once, as a `TrainStep` over:

    loss      (inputs, train) -> `StepLoss`: its forward passes and losses on a batch's
              tensors, for the parameter groups `train` names (TD3 trains its actor
              every other step); plain PyTorch over its modules, called as usual.
    modules   every nn.Module the loss reads (online networks, target networks, SAC's
              temperature), by name.
    groups    what each optimizer trains (`ParameterGroup`), built by beast.train_step.optim.
    targets   target networks that follow online ones by Polyak averaging or copies
              (`TargetNetwork`).

and calls it once per optimizer step with the batch's tensors (and, training nothing,
`train=()`, for a forward pass alone: PPO's fixed targets), or once for several steps,
one on each batch of a block (`TrainStep.steps`: a replay's --updates_per_sample
batches, PPO's minibatches; each step may train groups of its own, as TD3's delayed
actor has it), which compiled are one graph. The engine runs the rest,
the same way for every algorithm and every user model (`--model`):

- Eager: the loss, `backward`, and the learner's `Stepper` (gradient clipping, the
  non-finite guard, the learning-rate schedule, the optimizers' steps), then the targets.
- Compiled (`--compile`): the whole step as one graph: the forward passes and losses,
  the gradients (torch.func over every trained parameter at once), the norm and its
  clipping, the finiteness verdict, the optimizers' arithmetic, the target updates and
  the priorities, with no host synchronisation inside. On CPU inductor turns it into a
  few fused C++ loops around the matrix products, packaged ahead of time (a later run
  of the same step loads the package in milliseconds); on CUDA the torch.compile'd
  step is captured in a CUDA graph, so that one replay launches the whole update.

What makes one graph possible: every parameter the step trains lives in one flat buffer
(the parameters become views into it, so the modules, the eager optimizers and
checkpoints see the same memory), each target network in another with the same layout,
and the optimizers' state (Adam's moments, RMSprop's averages, step counts) in flat
buffers that the optimizers' own state entries view. A skipped (non-finite) step is
a `where` in the graph, not a branch on the host. Either path can take over from the
other at any step, and both write the same tensors.

The first step of each kind (`train` and target schedule) runs eagerly: it tells which
parameters the loss reaches (an unused parameter is not stepped, as torch's optimizers
skip a parameter without gradient) and what an eager step costs. The next one compiles.
A compilation that fails, or a graph that cannot be made, leaves the run on the eager
path, said once in the log; it never stops a run.

The modules, each of one purpose:

    interface.py    what an algorithm hands the step, and what a step hands back
    step.py         `TrainStep`: the eager path, and which path each kind of step takes
    lines.py        what the step says of its path: the plan, a build's progress
    flat.py         the flat parameter, target and optimizer-state buffers
    arithmetic.py   Adam's and RMSprop's steps on flat tensors, for the graph
    graph.py        the compiled step's function
    compilation.py  a kind's call compiled: traced and packaged, loaded, or torch.compile's
    package.py      the CPU's compiled steps, traced and packaged ahead of time
    build_child.py  the child process that builds a package, and one started ahead
    known_packages.py  the record across runs of the packages each step was built into
    cuda_graph.py   a compiled step replayed as one CUDA graph
    auto.py         --compile auto: whether compiling pays, and the records kept of it
    background.py   compilations in a thread of their own, and the lock steps share
    compiler.py     inductor's settings, set in every thread that compiles
"""

from beast.train_step.background import (
    MODULES_IN_USE,
    StepAbandoned,
    compilations_under_way,
    wait_for_compilations,
)
from beast.train_step.interface import ParameterGroup, StepLoss, StepResult, TargetNetwork
from beast.train_step.step import COMPILE_MODES, TrainStep
from beast.util.records import compile_cache_dir

__all__ = [
    "COMPILE_MODES",
    "MODULES_IN_USE",
    "ParameterGroup",
    "StepAbandoned",
    "StepLoss",
    "StepResult",
    "TargetNetwork",
    "TrainStep",
    "compilations_under_way",
    "compile_cache_dir",
    "wait_for_compilations",
]
