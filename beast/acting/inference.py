"""Central (SEED-style) inference: actors post requests, the learner process answers.

Both ways of acting run the algorithm's `ActingRule` (beast/algos/base.py) over the
model's outputs, so they know no algorithm: `LocalInference` in an actor (or an env
server, or --mode test) over its own record arrays, the `InferenceServer` over rows of
the request table.

With `--policy central` actors run no model. Each actor owns one group of
K rows in a request table in shared memory: it writes its K envs' inputs
(observation, reward, done, last action) into its rows, posts them through
the native `Batcher` (beast/native/batcher.c) and sleeps until they are
answered. Inference threads in the learner process collect ready rows in
batches, run one forward pass per batch on `--actor_device`, and write the
policy's record (the action, and what the algorithm stores with it: IMPALA's
logits and baseline) and the new recurrent states back into the same rows
before answering, which wakes exactly the actors served. Per-env parameters of
the policy (Ape-X's epsilons) live in the table too, one row per env, as SEED RL
keeps them on the server.

    InferenceTable   the shared tensors plus the Batcher; built by the runner,
                     pickled to every actor.
    CentralInference    the actor's side: post() writes the inputs and posts them,
                     wait() sleeps until they are answered.
    InferenceServer  the learner process's side: threads that collect,
                     forward, scatter and answer.

A batch of contiguous rows (one actor's group, or neighbours': the common
case) is read and written in place, through views the server keeps per row
range (with the policy bound to those rows once); other batches are gathered
with index_select and scattered back. Policies draw actions on the CPU, whatever
the actor device.

Recurrent state lives in the table, one row per env: the server reads the
state of the rows it serves and writes their next state back, so an actor's
envs keep their state whichever batch serves them. A new actor process
resets its rows to the model's initial state.

The server's model is its own copy on `--actor_device`, refreshed from the
weights the learner publishes (the shared CPU model local actors use) once
at least `--inference_sync_every` updates have happened since the last
refresh. Failure: an actor that dies holding requests costs the server
nothing (it never waits on a particular actor; the supervisor resets the
dead actor's group); a server that dies leaves actors waiting with a
timeout, after which they check that the learner process is alive and
exit; closing the table (shutdown) wakes everyone.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from beast.algos.base import ActingRule, as_outputs
from beast.fields import Field, map_inputs, model_inputs, numpy_dtype, shared_zeros, torch_dtype
from beast.native import Batcher, QueueClosed
from beast.native.acting import StepCopies
from beast.util.threads import ThreadGroup

__all__ = [
    "CentralInference",
    "InferenceServer",
    "InferenceStats",
    "InferenceTable",
    "LocalInference",
    "forward_precision",
]

# How long a blocked server or actor sleeps before checking whether to stop.
_POLL_SECONDS = 0.2
# Row ranges whose views a server keeps (one per actor group, or run of groups,
# it has served); past this many the cache starts over.
_MAX_PLANS = 256


def forward_precision(device_type: str, bf16: bool) -> contextlib.AbstractContextManager:
    """bf16 autocast for an acting forward pass, or nothing at all: even a disabled
    autocast costs its enter and exit on every step."""
    return _ThreadAutocast(device_type) if bf16 else contextlib.nullcontext()


class _ThreadAutocast:
    """bf16 autocast of this thread's ops that leaves torch's cast cache alone.

    `torch.autocast` keeps weight casts in a cache shared by every thread, and its exit
    clears that cache under a mutex with the GIL released. Destroying casts the learner
    thread cached while compiling needs the GIL, and the learner holds the GIL while it
    waits for the mutex: in a bf16 `--policy central` run, the inference thread and the
    learner deadlocked (torch 2.13). Setting the thread's autocast state directly, with
    its cache off, never takes that mutex and never clears the cache.
    """

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._saved: tuple[bool, torch.dtype, bool] | None = None

    def __enter__(self) -> None:
        device = self.device_type
        self._saved = (
            torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device),
            torch.is_autocast_cache_enabled(),
        )
        torch.set_autocast_enabled(device, True)
        torch.set_autocast_dtype(device, torch.bfloat16)
        torch.set_autocast_cache_enabled(False)

    def __exit__(self, *exc_info: object) -> None:
        enabled, dtype, cache_enabled = self._saved
        torch.set_autocast_enabled(self.device_type, enabled)
        torch.set_autocast_dtype(self.device_type, dtype)
        torch.set_autocast_cache_enabled(cache_enabled)


def _no_grad() -> contextlib.AbstractContextManager:
    """torch.no_grad(), or nothing where autograd is already off (actor processes and
    inference threads turn it off once: a context costs its enter and exit per step)."""
    return torch.no_grad() if torch.is_grad_enabled() else contextlib.nullcontext()


def record_arrays(policy: ActingRule, num_envs: int) -> dict[str, np.ndarray]:
    """Zeroed `[num_envs, ...]` arrays for `policy`'s record."""
    return {
        key: np.zeros((num_envs, *f.shape), dtype=numpy_dtype(f.dtype))
        for key, f in policy.record_spec().items()
    }


class LocalInference:
    """The actor runs its own model copy (on the CPU: weights in shared memory).

    `record` holds the policy's record for the K envs (`ActingRule.record_spec`: the action,
    and what the algorithm stores with it), `[K, ...]` arrays overwritten by every `post`:
    the actor copies them into its slots from these fixed addresses
    (beast.native.acting). `state` is the recurrent state, per env ([K, d0, ...] per
    tensor, the layout a rollout slot stores), that produced the latest output.

    params: the K envs' rows of the policy's per-env parameters (`ActingRule.env_params`).
    """

    def __init__(
        self,
        model: nn.Module,
        policy: ActingRule,
        num_envs: int,
        params: Mapping[str, np.ndarray] | None = None,
        bf16: bool = False,
    ) -> None:
        self.model = model
        self.bf16 = bf16
        self.num_envs = num_envs
        self._state_next = model.initial_state(num_envs)  # tensors [d0, K, ...]
        self.state: tuple[torch.Tensor, ...] = ()
        self.record = record_arrays(policy, num_envs)
        self._act = policy.bind(self.record, params or policy.env_params(num_envs))
        # The model's time-major [1, K, ...] inputs: views of the caller's, made once per
        # inputs dict (an actor passes the same dict, its tensors updated in place, every
        # step), the observation's leaves nested as the model reads them.
        self._inputs: dict[str, torch.Tensor] | None = None
        self._time_major_inputs: dict[str, Any] = {}

    def _time_major(self, inputs: dict[str, torch.Tensor]) -> dict[str, Any]:
        if inputs is not self._inputs:
            self._inputs = inputs  # held, so its id cannot be reused by another dict
            self._time_major_inputs = model_inputs(
                {key: value.unsqueeze(0) for key, value in inputs.items()}
            )
        return self._time_major_inputs

    def post(self, inputs: dict[str, torch.Tensor]) -> None:
        """inputs: the observation's fields (obs [K, ...] for a Box; one per leaf for a
        Dict or Tuple, beast/fields.py), reward [K], done [K], last_action [K]. Pass one
        dict every step and update its tensors in place: views of them are made once per
        dict (replacing a tensor in the same dict is not seen). A local policy runs
        the forward pass here; `wait` only returns its record."""
        state_in = self._state_next
        with _no_grad(), forward_precision("cpu", self.bf16):
            output, state_next = self.model(self._time_major(inputs), state_in)
            self._act(as_outputs(output))
        # Under autocast an LSTM hands back bf16 states; the state carried from step to
        # step (and stored with each rollout) stays float32, as the learner's is.
        self._state_next = tuple(s.float() for s in state_next)
        self.state = tuple(s.transpose(0, 1) for s in state_in)

    def wait(self) -> dict[str, np.ndarray]:
        return self.record

    def act(self, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """`post` then `wait`."""
        self.post(inputs)
        return self.record


class InferenceTable:
    """The request table: inputs, records, policy parameters and recurrent state of
    `num_actors * num_envs` rows.

    Row `a * num_envs + k` is env k of actor a. An actor's envs are split into
    `num_env_splits` lanes (beast/acting/actor.py) that post separately: the Batcher's
    group `a * num_env_splits + s` is lane s of actor a, its `lane_envs` =
    num_envs / num_env_splits rows. Picklable to actor processes (shared memory
    travels).

    obs: the observation's fields (`EnvSpec.obs_fields()`), one input per leaf.
    policy: the algorithm's acting rule; the table holds its record and its per-env
        parameters (`env_params` over all rows, which are all envs of the run).
    initial_state: the model's `initial_state(1)` (tensors [d0, 1, ...]);
        every row starts from it.
    """

    def __init__(
        self,
        *,
        num_actors: int,
        num_envs: int,
        obs: Mapping[str, Field],
        policy: ActingRule,
        initial_state: Sequence[torch.Tensor] = (),
        num_servers: int = 1,
        num_env_splits: int = 1,
    ) -> None:
        if num_env_splits < 1 or num_envs % num_env_splits:
            raise ValueError(f"num_env_splits ({num_env_splits}) must divide num_envs ({num_envs})")
        rows = num_actors * num_envs
        action = policy.record_spec()["action"]  # last_action has the action's layout
        self.num_envs = num_envs
        self.num_env_splits = num_env_splits
        self.lane_envs = num_envs // num_env_splits
        self.batcher = Batcher(num_actors * num_env_splits, self.lane_envs, num_servers)

        def shared(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
            return shared_zeros((rows, *shape), dtype)

        # Inputs, written by actors.
        self.inputs = {
            **{key: shared(f.shape, torch_dtype(f.dtype)) for key, f in obs.items()},
            "reward": shared((), torch.float32),
            "done": shared((), torch.bool),
            "last_action": shared(action.shape, action.dtype),
        }
        # The policy's record, written by servers.
        self.record = {key: shared(f.shape, f.dtype) for key, f in policy.record_spec().items()}
        # The policy's per-env parameters, constant.
        self.params = {}
        for key, values in policy.env_params(rows).items():
            self.params[key] = shared(values.shape[1:], torch_dtype(values.dtype))
            self.params[key].numpy()[...] = values
        # Recurrent state per row, [rows, d0, ...]: read and written by servers.
        self.initial_state = tuple(s.transpose(0, 1)[0].clone() for s in initial_state)
        self.state = tuple(shared(s.shape, s.dtype) for s in self.initial_state)
        for group in range(num_actors * num_env_splits):
            self.reset_rows(group)

    def group(self, actor_index: int, split: int = 0) -> int:
        """The Batcher group of lane `split` of actor `actor_index`."""
        return actor_index * self.num_env_splits + split

    def rows(self, group: int) -> slice:
        return slice(group * self.lane_envs, (group + 1) * self.lane_envs)

    def reset_rows(self, group: int) -> None:
        """Give `group`'s rows the model's initial state."""
        rows = self.rows(group)
        for table_state, initial in zip(self.state, self.initial_state, strict=True):
            table_state[rows] = initial

    def drop_requests(self, actor_index: int) -> None:
        """An actor died: its lanes' unanswered requests are not served, and an answer
        already in flight is ignored rather than credited to its replacement."""
        for split in range(self.num_env_splits):
            self.batcher.reset_group(self.group(actor_index, split))

    def nbytes(self) -> int:
        tensors = [*self.inputs.values(), *self.record.values(), *self.params.values()]
        return sum(t.numel() * t.element_size() for t in [*tensors, *self.state])

    def close(self) -> None:
        """Wake every actor and server; their blocking calls raise QueueClosed."""
        self.batcher.close()


class CentralInference:
    """The actor's side of central inference: write inputs, post, sleep, read.

    `record` views this actor's lane's rows of the table's record (`[K, ...]` numpy
    arrays at fixed addresses, written by the server). `state` is the recurrent state
    per env ([K, d0, ...] per tensor) that produced the latest output (copied before
    posting, because the server overwrites the rows with the next state).

    server_alive: called each time a wait times out; False makes `wait` raise
        QueueClosed, which ends the actor (the learner process is gone).
    split: which of the actor's lanes this is (its table.lane_envs envs).
    """

    def __init__(
        self,
        table: InferenceTable,
        actor_index: int,
        server_alive: Callable[[], bool],
        split: int = 0,
    ) -> None:
        self.table = table
        self.group = table.group(actor_index, split)
        self.server_alive = server_alive
        self._rows = table.rows(self.group)
        table.reset_rows(self.group)
        self.state = tuple(s[self._rows].clone() for s in table.state)
        self._inputs = {key: value[self._rows] for key, value in table.inputs.items()}
        self.record = {key: value[self._rows].numpy() for key, value in table.record.items()}
        # The copies of one post, made once per caller's inputs dict (as LocalInference's
        # views are): its inputs into this actor's rows, and the rows' state into `state`.
        self._caller_inputs: dict[str, torch.Tensor] | None = None
        self._copies: StepCopies | None = None

    def _input_copies(self, inputs: dict[str, torch.Tensor]) -> StepCopies:
        if inputs is not self._caller_inputs:
            self._caller_inputs = inputs  # held, so its id cannot be reused by another dict
            pairs = [
                (row_view.numpy()[None], inputs[key].numpy())
                for key, row_view in self._inputs.items()
            ]
            pairs += [
                (own.numpy()[None], table_state[self._rows].numpy())
                for own, table_state in zip(self.state, self.table.state, strict=True)
            ]
            self._copies = StepCopies(pairs)
        return self._copies

    def post(self, inputs: dict[str, torch.Tensor]) -> None:
        """inputs: the table's input fields (the observation's, reward, done,
        last_action), [K, ...] contiguous CPU tensors of the table's dtypes. As for
        LocalInference, pass one dict every step and update its tensors in place."""
        self._input_copies(inputs).run()
        self.table.batcher.post(self.group)

    def wait(self) -> dict[str, np.ndarray]:
        """Sleep until the posted requests are answered (at once if they are)."""
        while not self.table.batcher.wait_answered(self.group, timeout=_POLL_SECONDS * 5):
            if not self.server_alive():
                raise QueueClosed("the inference server's process is gone")
        return self.record

    def act(self, inputs: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
        """`post` then `wait`."""
        self.post(inputs)
        return self.wait()


class _RowsPlan:
    """Views of table rows [first, first + n) for serving them: time-major inputs
    [1, n, ...], recurrent state [d0, n, ...], and the policy bound to the rows' record
    and parameters. Made once per row range a server sees."""

    def __init__(self, table: InferenceTable, policy: ActingRule, first: int, n: int) -> None:
        rows = slice(first, first + n)
        self.inputs = model_inputs(
            {key: value[rows].unsqueeze(0) for key, value in table.inputs.items()}
        )
        self.state = tuple(s[rows].transpose(0, 1) for s in table.state)
        self.act = policy.bind(
            {key: value.numpy()[rows] for key, value in table.record.items()},
            {key: value.numpy()[rows] for key, value in table.params.items()},
        )


@dataclass
class InferenceStats:
    """Counters of the server threads (read without a lock: approximate)."""

    batches: int = 0
    requests: int = 0
    syncs: int = 0
    serving_seconds: float = 0.0  # from a batch's collect to its answer, all threads

    @property
    def mean_batch(self) -> float:
        return self.requests / self.batches if self.batches else 0.0

    def summary(self) -> str:
        """One line for the run log: how well requests batch, and the servers' load."""
        return (
            f"{self.batches:,} batches of {self.mean_batch:.1f} envs on average,"
            f" {self.serving_seconds:.1f} s serving, {self.syncs:,} weight refreshes"
        )


class InferenceServer(ThreadGroup):
    """Inference threads in the learner process: collect, forward, act, answer.

    Thread i serves the Batcher's server index i (its contiguous share of the
    actors). All threads share one model on `device`, refreshed from
    `source` (the learner's published weights) when `num_updates()` has
    advanced by at least `sync_every` since the last refresh. A forward pass
    may overlap a refresh, as a local actor's may overlap the learner's
    publish: a batch can act with weights from two adjacent updates.

    An exception in a thread is kept in `error` and sets `failed`, for the
    runner's monitor to stop the run; the thread answers nothing more, and
    its actors then wait until shutdown closes the table.

    With `bf16`, forward passes run under bf16 autocast (a bf16 run's, as local
    actors do); records and recurrent states are stored as the table holds them.
    """

    def __init__(
        self,
        *,
        table: InferenceTable,
        policy: ActingRule,
        model: nn.Module,
        source: nn.Module,
        device: torch.device,
        max_batch: int,
        batch_window: float,
        sync_every: int = 1,
        num_updates: Callable[[], int] = lambda: 0,
        bf16: bool = False,
    ) -> None:
        self.table = table
        self.policy = policy
        self.bf16 = bf16
        self.model = model.to(device).eval()
        self.source = source
        self.device = device
        self.max_batch = max_batch
        self.batch_window = batch_window
        self.sync_every = sync_every
        self.num_updates = num_updates
        self.stats = InferenceStats()
        self.failed = threading.Event()
        super().__init__(on_error=self.failed)
        self._sync_lock = threading.Lock()
        self._plans: dict[tuple[int, int], _RowsPlan] = {}  # shared by the threads
        self._synced_at = num_updates()
        self._sync(force=True)
        for i in range(table.batcher.num_servers):
            self._add_thread(functools.partial(self._serve_loop, i), f"inference-{i}")

    def _sync(self, force: bool = False) -> None:
        updates = self.num_updates()
        if not force and updates - self._synced_at < self.sync_every:
            return
        with self._sync_lock:
            if not force and updates - self._synced_at < self.sync_every:
                return  # another thread just did it
            with torch.no_grad():
                for own, published in zip(
                    self.model.state_dict().values(),
                    self.source.state_dict().values(),
                    strict=True,
                ):
                    own.copy_(published, non_blocking=True)
            self._synced_at = updates
            self.stats.syncs += 1

    def _serve_loop(self, server: int) -> None:
        torch.set_grad_enabled(False)  # for this thread: serving never backpropagates
        collect = self.table.batcher.collector(
            server, self.max_batch, batch_window=self.batch_window
        )
        stats = self.stats
        while not self._stop.is_set():
            indices = collect(_POLL_SECONDS)
            if len(indices):
                started = time.perf_counter()
                self._sync()
                self.serve(indices)
                stats.serving_seconds += time.perf_counter() - started

    def serve(self, indices: torch.Tensor) -> None:
        """Answer the requests in rows `indices` (int64 [n], ascending, from collect)."""
        served = indices.numpy()
        first, n = int(served[0]), len(served)
        if int(served[-1]) - first + 1 == n:
            # Contiguous rows (one actor's group, or neighbours'): the common case.
            self._serve_rows(self._rows_plan(first, n))
        else:
            self._serve_gathered(indices, served)
        self.table.batcher.answer(indices)
        self.stats.batches += 1
        self.stats.requests += n

    def _rows_plan(self, first: int, n: int) -> _RowsPlan:
        plan = self._plans.get((first, n))
        if plan is None:
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            plan = self._plans[first, n] = _RowsPlan(self.table, self.policy, first, n)
        return plan

    def _serve_rows(self, plan: _RowsPlan) -> None:
        """Rows [first, first + n): the model reads the table's rows in place (on the
        CPU; other devices get copies), and the policy writes their record in place."""
        device = self.device
        if device.type == "cpu":
            inputs, state = plan.inputs, plan.state
        else:
            inputs = map_inputs(lambda value: value.to(device), plan.inputs)
            state = tuple(s.to(device) for s in plan.state)
        with _no_grad():
            with forward_precision(device.type, self.bf16):
                output, next_state = self.model(inputs, state)
            plan.act(as_outputs(output))
            for row_state, new in zip(plan.state, next_state, strict=True):
                row_state.copy_(new)

    def _serve_gathered(self, indices: torch.Tensor, served: np.ndarray) -> None:
        table, device = self.table, self.device

        def read(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.index_select(0, indices).to(device)

        inputs = model_inputs(
            {key: read(value).unsqueeze(0) for key, value in table.inputs.items()}
        )
        state = tuple(read(s).transpose(0, 1) for s in table.state)
        record = record_arrays(self.policy, len(served))
        act = self.policy.bind(record, {k: v.numpy()[served] for k, v in table.params.items()})
        with _no_grad():
            with forward_precision(device.type, self.bf16):
                output, next_state = self.model(inputs, state)
            act(as_outputs(output))
            for table_state, new in zip(table.state, next_state, strict=True):
                table_state.index_copy_(
                    0, indices, new.transpose(0, 1).to(device="cpu", dtype=table_state.dtype)
                )
        for key, values in record.items():
            table.record[key].numpy()[served] = values
