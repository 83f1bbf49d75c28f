"""R2D2: n-step double Q-learning on replayed sequences (Ape-X, the feed-forward
member of the family, trains on single transitions: beast/algos/apex.py).

R2D2: Kapturowski et al. 2019, "Recurrent Experience Replay in Distributed
Reinforcement Learning", section 2 and 3. Ape-X: Horgan et al. 2018,
"Distributed Prioritized Experience Replay". Pure functions: tensors in,
tensors out, every constant an argument.

Batch layout: replayed sequences of ``L`` rows, time-major, the same
alignment as beast's rollouts (``beast.experience.rollout_slots``;
``beast.experience.sequence_replay`` stores
``L = seq_len + 1``: the steps and the one after them). Row t holds

    obs           [L, B, ...]  the observation x_t
    reward        float [L, B] received on the transition INTO row t
    done          bool  [L, B] row t starts a new episode (recurrent state
                               resets there)
    terminated    bool  [L, B] the transition into row t ended the episode
                               in a terminal state: nothing bootstraps
                               across it (x_t is the next episode's first
                               observation, kept for its reward)
    truncated     bool  [L, B] x_t is the final observation of an episode
                               cut by a time limit: targets that reach it
                               stop there and bootstrap from Q(x_t, .)
    action        int64 [L, B] a_t, taken at x_t
    mask          bool  [L, B] row t is a real step of the sequence's
                               episode; False on the terminal row (a
                               terminated or truncated episode's last row,
                               whose action was never taken) and on padding

so the transition out of row t pairs ``action[t]`` with ``reward[t + 1]``
and ``terminated[t + 1]``. Sequences never cross an episode boundary (R2D2
section 2.3 stores fixed-length sequences "never crossing episode
boundaries"): a sequence that reaches an episode end holds the terminal row,
then padding.

The n-step double-Q target for row t (R2D2 section 2, with Ape-X's n-step
return and van Hasselt et al.'s double-Q action), in paper notation:

    y_t = h( sum_{k=0}^{n-1} gamma^k r_{t+k} + gamma^n h^-1( Q(x_{t+n}, a*; theta-) ) )
    a*  = argmax_a Q(x_{t+n}, a; theta)

where ``r_{t+k}`` is ``reward[t + k + 1]`` here, theta the online and theta-
the target network, and h the value rescaling (beast/algos/value_rescaling.py). An
episode end inside the window stops the sum after its reward and drops the bootstrap
term; a truncated row inside the window stops the sum there and bootstraps from that
row (its Q-values are the final observation's, not 0 and not the next episode's).

Priorities (R2D2 section 2.3): ``p = eta * max_t |delta_t| + (1 - eta) *
mean_t |delta_t|`` over the sequence's trained steps, ``delta_t = y_t -
Q(x_t, a_t; theta)``, in the rescaled space the loss lives in.

Dtypes (beast/algos/dtypes.py): results have the promoted dtype of the float
inputs (float32 in, float32 out; float64 in, float64 out); the targets and the
loss are computed in at least float32.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from beast.algos.base import LearnerContext, Update, as_outputs
from beast.algos.dtypes import compute_dtype
from beast.algos.impala import clip_rewards
from beast.algos.q_learning import (
    QLearningAlgorithm,
    QLossOutput,
    double_q_values,
    q_values_taken,
    transformed_targets,
)
from beast.algos.replay_args import QLearningArgs
from beast.algos.target_update import TargetNetworkUpdate
from beast.algos.value_rescaling import DEFAULT_RESCALE_EPS
from beast.config import ConfigError, flag, require_positive
from beast.experience.contract import Batch
from beast.experience.specs import Experience, SequenceReplay
from beast.fields import core_state, index_inputs, model_inputs
from beast.train_step import StepLoss

__all__ = [
    "NStepTargets",
    "R2D2",
    "R2D2Args",
    "SequenceQUpdate",
    "n_step_double_q_targets",
    "r2d2_loss",
    "sequence_priorities",
    "unroll_with_burn_in",
]
DEFAULT_ETA = 0.9  # priority mix, R2D2 section 2.3


class NStepTargets(NamedTuple):
    """n-step double-Q targets, both ``[T, B]``, detached.

    targets: y_t (in the rescaled space when rescaling is on); 0 where not valid.
    valid: rows that get a target, see `n_step_double_q_targets`.
    """

    targets: Tensor
    valid: Tensor


@torch.no_grad()
def n_step_double_q_targets(
    online_q: Tensor,
    target_q: Tensor,
    rewards: Tensor,
    terminated: Tensor,
    truncated: Tensor,
    mask: Tensor,
    *,
    n_step: int,
    discounting: float,
    rescale_eps: float | None = DEFAULT_RESCALE_EPS,
    truncate_at_end: bool = True,
) -> NStepTargets:
    """R2D2's n-step double-Q targets over sequences (module docstring, y_t).

    Args:
        online_q: float [T, B, A], online Q-values at every row (for a*).
        target_q: float [T, B, A], target-network Q-values at every row.
        rewards: float [T, B], ``rewards[t]`` received on arriving at row t.
        terminated: bool [T, B], the transition into row t ended the episode in
            a terminal state.
        truncated: bool [T, B], row t is a time-limited episode's final
            observation.
        mask: bool [T, B], row t is a real step (see the module docstring).
        n_step: n >= 1, the number of rewards summed before bootstrapping.
        discounting: gamma in [0, 1].
        rescale_eps: eps of the value rescaling h; None for no rescaling (h
            the identity: Ape-X and plain DQN targets).
        truncate_at_end: what a row whose n-step window runs past the last
            row of the sequence gets. True: the rewards up to the last row,
            bootstrapped from it with gamma^k for the k < n steps taken (a
            k-step target). With R2D2's burn-in equal to the overlap, a step
            in the last rows of one sequence is burn-in in the next, so this
            is the only sequence that trains it. False: no target (only rows
            with n steps, or an episode end, inside the sequence): Ape-X with
            seq_len = n + 1 then trains exactly row 0.

    Returns:
        `NStepTargets`: y_t where ``valid[t]``, and ``valid[t] = mask[t]``
        and some row follows t in the sequence (and, without
        ``truncate_at_end``, the window is complete: n steps, or an episode end
        of either kind inside it).

    Rewards are used as given: clip them before calling if wanted (R2D2
    relies on the rescaling instead and does not clip).
    """
    if n_step < 1:
        raise ValueError(f"n_step must be >= 1, got {n_step}")
    if not 0.0 <= discounting <= 1.0:
        raise ValueError(f"discounting must be in [0, 1], got {discounting}")
    for name, tensor in (
        ("rewards", rewards),
        ("terminated", terminated),
        ("truncated", truncated),
        ("mask", mask),
    ):
        if tensor.shape != online_q.shape[:-1]:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, expected {tuple(online_q.shape[:-1])}"
            )
    dtype = compute_dtype(online_q, target_q, rewards)
    rewards = rewards.to(dtype)
    terminated, truncated = terminated.bool(), truncated.bool()
    bootstrap = double_q_values(online_q, target_q).to(dtype)

    num_rows = rewards.shape[0]
    rows = torch.arange(num_rows, device=rewards.device).view(-1, *([1] * (rewards.dim() - 1)))
    rows = rows.expand_as(rewards)
    returns = torch.zeros_like(rewards)
    discount = torch.ones_like(rewards)  # gamma^k for the k steps taken so far
    boot_row = rows.clone()  # the row the bootstrap value comes from
    ended = torch.zeros_like(terminated)  # a terminal state was reached: no bootstrap
    cut = torch.zeros_like(truncated)  # a truncated row was reached: bootstrap from it
    steps = torch.zeros_like(rows)  # steps taken, <= n
    for k in range(1, n_step + 1):
        if k >= num_rows:
            break
        # Row t looks at row t + k; rows in the last k have no such row.
        reward_k = torch.zeros_like(rewards)
        reward_k[:-k] = rewards[k:]
        terminated_k = torch.zeros_like(terminated)
        terminated_k[:-k] = terminated[k:]
        truncated_k = torch.zeros_like(truncated)
        truncated_k[:-k] = truncated[k:]
        in_sequence = rows < num_rows - k
        active = in_sequence & ~ended & ~cut
        returns = torch.where(active, returns + discount * reward_k, returns)
        discount = torch.where(active, discount * discounting, discount)
        boot_row = torch.where(active, rows + k, boot_row)
        steps = torch.where(active, steps + 1, steps)
        ended = ended | (active & terminated_k)
        cut = cut | (active & truncated_k & ~terminated_k)

    def targets_from(values: Tensor) -> Tensor:
        bootstrap_term = discount * values.gather(0, boot_row)
        # where, not a multiply by (1 - ended): the terminal row's Q-values are of
        # another episode, and must not leak in even if they are not finite.
        return returns + torch.where(ended, torch.zeros_like(bootstrap_term), bootstrap_term)

    targets = transformed_targets(bootstrap, targets_from, rescale_eps)
    valid = mask.bool() & (steps > 0)
    if not truncate_at_end:
        valid = valid & ((steps == n_step) | ended | cut)
    targets = torch.where(valid, targets, torch.zeros_like(targets))
    return NStepTargets(targets=targets, valid=valid)


def sequence_priorities(td_errors: Tensor, valid: Tensor, eta: float = DEFAULT_ETA) -> Tensor:
    """``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|`` over valid t: [B].

    R2D2 section 2.3: a mix of max and mean, because a mean over a long
    sequence washes out the few large errors that make it worth replaying.
    A sequence with no valid step gets priority 0 (nothing in it trains).

    Args:
        td_errors: float [T, B], delta_t (any sign; detached here).
        valid: bool [T, B], the steps that count.
        eta: weight of the max, in [0, 1].
    """
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta must be in [0, 1], got {eta}")
    if td_errors.shape != valid.shape:
        raise ValueError(
            f"td_errors {tuple(td_errors.shape)} and valid {tuple(valid.shape)} differ"
        )
    valid = valid.bool()
    abs_td = torch.where(valid, td_errors.detach().abs(), torch.zeros_like(td_errors))
    count = valid.sum(dim=0)
    mean = abs_td.sum(dim=0) / count.clamp(min=1)
    # |td| >= 0, so zeros at invalid steps never raise the max.
    return eta * abs_td.max(dim=0).values + (1.0 - eta) * mean


def r2d2_loss(
    online_q: Tensor,
    target_q: Tensor,
    batch: Mapping[str, Tensor],
    weights: Tensor,
    *,
    burn_in: int,
    n_step: int,
    discounting: float,
    eta: float = DEFAULT_ETA,
    rescale_eps: float | None = DEFAULT_RESCALE_EPS,
    truncate_at_end: bool = True,
) -> QLossOutput:
    """Importance-weighted n-step double-Q loss over sequences (R2D2; Ape-X).

    Rows before ``burn_in`` only warm the recurrent state up (R2D2 section 3)
    and get no loss; on the rest, ``delta_t = y_t - Q(x_t, a_t; theta)`` with
    y_t from `n_step_double_q_targets`, and

        loss = mean_b w_b * mean_{valid t} 0.5 delta_t^2

    (a mean over steps, so long and short sequences weigh the same per
    sample, then over the batch; a sequence with no valid step adds 0).

    Ape-X is the same call with a feed-forward network, ``burn_in = 0``,
    sequences of ``n_step + 1`` rows, ``truncate_at_end=False`` and usually
    ``rescale_eps=None``.

    Args:
        online_q: float [L, B, A], the online network over all L rows (rows
            before burn_in may be detached: see `unroll_with_burn_in`).
        target_q: float [L, B, A], the target network over the same rows.
        batch: "action" int64 [L, B], "reward" float [L, B], "terminated" and
            "truncated" bool [L, B], "mask" bool [L, B] (module docstring).
        weights: float [B], importance-sampling weights (replay), 0 for a
            sample to ignore.
        burn_in: rows at the start that get no loss, 0 <= burn_in < L.
        n_step, discounting, rescale_eps, truncate_at_end: see
            `n_step_double_q_targets`.
        eta: priority mix, see `sequence_priorities`.

    Returns:
        `QLossOutput`; stats: total_loss, mean_q (Q(x_t, a_t) over valid steps),
        mean_target, mean_abs_td, max_abs_td, valid_steps, mean_priority.
    """
    num_rows = online_q.shape[0]
    if not 0 <= burn_in < num_rows:
        raise ValueError(f"burn_in must be in [0, {num_rows}), got {burn_in}")
    if weights.shape != online_q.shape[1:2]:
        raise ValueError(
            f"weights has shape {tuple(weights.shape)}, expected {tuple(online_q.shape[1:2])}"
        )
    online_q, target_q = online_q[burn_in:], target_q[burn_in:]
    actions, rewards, terminated, truncated, mask = (
        batch[key][burn_in:] for key in ("action", "reward", "terminated", "truncated", "mask")
    )
    targets, valid = n_step_double_q_targets(
        online_q,
        target_q,
        rewards,
        terminated,
        truncated,
        mask,
        n_step=n_step,
        discounting=discounting,
        rescale_eps=rescale_eps,
        truncate_at_end=truncate_at_end,
    )
    dtype = targets.dtype
    q_taken = q_values_taken(online_q, actions).to(dtype)
    valid_f = valid.to(dtype)
    td_errors = (targets - q_taken) * valid_f
    count = valid_f.sum(dim=0)
    per_sequence = (0.5 * td_errors.pow(2)).sum(dim=0) / count.clamp(min=1.0)
    total_loss = (weights * per_sequence).mean()

    priorities = sequence_priorities(td_errors.detach(), valid, eta)
    with torch.no_grad():
        num_valid = valid_f.sum().clamp(min=1.0)
        abs_td = td_errors.detach().abs()
        stats = {
            "total_loss": total_loss.detach(),
            "mean_q": (q_taken.detach() * valid_f).sum() / num_valid,
            "mean_target": (targets * valid_f).sum() / num_valid,
            "mean_abs_td": abs_td.sum() / num_valid,
            "max_abs_td": abs_td.max(),
            "valid_steps": valid_f.sum(),
            "mean_priority": priorities.mean(),
        }
    return QLossOutput(total_loss=total_loss, stats=stats, priorities=priorities)


def unroll_with_burn_in(
    model: nn.Module,
    inputs: Mapping[str, Tensor],
    core_state: tuple[Tensor, ...],
    burn_in: int,
) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run a Q-network over [L, B] inputs, the first ``burn_in`` rows without gradient.

    R2D2 section 3: the stored state at a sequence's start is stale (an older
    network produced it), so the first rows only refresh the state and the
    loss trains on the rest, with gradients that stop at the burned-in state.
    ``model(inputs, core_state)`` returns ``(outputs with q_values [T, B, A],
    new state)`` (beast.models' convention; outputs a dict or a NamedTuple).

    Returns:
        q_values [L, B, A] (rows before burn_in detached) and the state after
        the last row.
    """
    num_rows = inputs["reward"].shape[0]
    if not 0 <= burn_in < num_rows:
        raise ValueError(f"burn_in must be in [0, {num_rows}), got {burn_in}")
    parts = []
    if burn_in > 0:
        with torch.no_grad():
            burn = index_inputs(inputs, slice(None, burn_in))
            output, core_state = model(burn, core_state)
        parts.append(as_outputs(output)["q_values"])
        core_state = tuple(s.detach() for s in core_state)
    output, core_state = model(index_inputs(inputs, slice(burn_in, None)), core_state)
    parts.append(as_outputs(output)["q_values"])
    q_values = parts[0] if len(parts) == 1 else torch.cat(parts)
    return q_values, core_state


# The plug-in: flags, model, acting, experience and update (beast/algos/base.py).


@dataclass(frozen=True)
class R2D2Args(QLearningArgs):
    """R2D2 (Kapturowski et al. 2019): recurrent Q-learning on replayed sequences."""

    min_replay_size: int = flag(1000, "Sequences in the replay before the learner samples.")
    seq_len: int = flag(80, "Steps per replayed sequence.")
    seq_overlap: int = flag(40, "Steps that adjacent sequences of an episode share.")
    burn_in: int = flag(
        40,
        "Steps at a sequence's start that only refresh the stored LSTM state (no loss, no"
        " gradient).",
    )


class SequenceQUpdate(TargetNetworkUpdate):
    """R2D2's update: burn-in unroll, target network, n-step double-Q loss, priorities.

    1. burn-in: the online network unrolls the first `burn_in` rows from the sequence's
       stored LSTM state without gradient, then the rest with it (R2D2 section 3); the
       target network unrolls all rows from the same state, without gradient;
    2. the loss (`loss_fn`, `r2d2_loss` with its constants bound), each sequence weighted
       by its importance weight, and the sequences' new priorities;
    3. the optimizer step (beast/train_step: eager or compiled; skipped when not
       finite), and every `target_update_period` applied updates the online weights
       copied into the target.
    """

    def __init__(self, *args: Any, burn_in: int, reward_clipping: str, **kwargs: Any) -> None:
        """`TargetNetworkUpdate`'s arguments (`loss_fn` returns a `QLossOutput`), and the
        rows of burn-in and the reward clipping."""
        self.burn_in = burn_in
        self.reward_clipping = reward_clipping
        super().__init__(*args, **kwargs)

    def loss(self, data: Mapping[str, Tensor], train: tuple[str, ...]) -> StepLoss:
        """Steps 1-2 of the class docstring on a batch's tensors."""
        context = self.context
        inputs = model_inputs(data)
        state = core_state(data)
        with context.autocast():
            online_q, _ = unroll_with_burn_in(self.model, inputs, state, self.burn_in)
            with torch.no_grad():
                target_outputs, _ = self.target_model(inputs, state)
        reward = clip_rewards(context.scale_rewards(data), self.reward_clipping)
        loss = self.loss_fn(
            online_q.float(),
            as_outputs(target_outputs)["q_values"].float(),
            {**data, "reward": reward},
            data.get("weights"),
        )
        return StepLoss(loss.total_loss, loss.stats, loss.priorities)

    def step_inputs(self, batch: Batch) -> tuple[dict[str, Tensor], dict[str, Any]]:
        """The batch's sequences and importance weights."""
        inputs = dict(batch.data)
        if batch.weights is not None:
            inputs["weights"] = batch.weights
        return inputs, {}


class R2D2(QLearningAlgorithm):
    """R2D2: an LSTM Q-network trained on prioritized replayed sequences."""

    name = "r2d2"
    summary = (
        "Recurrent n-step double Q-learning on a prioritized replay of sequences"
        " (Kapturowski et al. 2019)."
    )
    Args = R2D2Args

    @classmethod
    def validate(cls, config: Any) -> None:
        QLearningArgs.check(config)
        require_positive(config, "min_replay_size")
        if config.min_replay_size > config.replay_size:
            raise ConfigError(
                f"--min_replay_size {config.min_replay_size} exceeds --replay_size"
                f" {config.replay_size}: learning would never start"
            )
        if config.seq_len <= 0:
            raise ConfigError(f"--seq_len must be positive, got {config.seq_len}")
        if not 0 <= config.seq_overlap < config.seq_len:
            raise ConfigError(
                f"--seq_overlap must be in [0, --seq_len {config.seq_len}), got"
                f" {config.seq_overlap}"
            )
        if not 0 <= config.burn_in < config.seq_len:
            raise ConfigError(
                f"--burn_in must be in [0, --seq_len {config.seq_len}) so that some steps"
                f" train, got {config.burn_in}"
            )

    def sequence_layout(self) -> tuple[int, int, int]:
        """(seq_len, seq_overlap, burn_in) of the replayed sequences."""
        return self.config.seq_len, self.config.seq_overlap, self.config.burn_in

    def q_network(self) -> dict[str, Any]:
        return {"use_lstm": True}

    def experience(self) -> Experience:
        config = self.config
        seq_len, seq_overlap, _ = self.sequence_layout()
        return SequenceReplay(
            seq_len=seq_len,
            seq_overlap=seq_overlap,
            capacity=config.replay_size,
            min_size=config.min_replay_size,
            priority_exponent=config.priority_exponent,
            importance_sampling_exponent=config.importance_sampling_exponent,
            samples_per_insert=config.samples_per_insert,
            frame_dedup=config.frame_dedup,
        )

    def learner(self, model: nn.Module, context: LearnerContext) -> Update:
        config = self.config
        _, _, burn_in = self.sequence_layout()
        loss_fn = functools.partial(
            r2d2_loss,
            burn_in=burn_in,
            n_step=config.n_step,
            discounting=config.discounting,
            rescale_eps=self.rescale_eps(),
            # A step in a sequence's last n rows is burn-in in the next sequence, so it
            # trains here with the shorter return there is (n_step_double_q_targets).
            truncate_at_end=True,
        )
        return self.target_network_update(
            SequenceQUpdate,
            model,
            context,
            loss_fn,
            burn_in=burn_in,
            reward_clipping=config.reward_clipping,
        )

    def describe(self) -> str:
        seq_len, seq_overlap, burn_in = self.sequence_layout()
        return (
            f"sequences of {seq_len} (overlap {seq_overlap}, burn-in {burn_in}),"
            f" {self.config.n_step}-step targets"
        )
