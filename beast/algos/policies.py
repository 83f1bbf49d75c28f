"""Acting rules the algorithms share (`beast.algos.base.ActingRule`).

    CategoricalPolicy    a ~ softmax(policy_logits), or its argmax when not exploring;
                         stores the logits (the behaviour policy V-trace corrects for)
                         and the baseline. IMPALA, LASER, PPO, A2C on discrete actions.
    GaussianPolicy       a ~ N(action_mean, exp(action_log_std)^2), or the mean when not
                         exploring; stores the mean, the log-std and the baseline. The
                         same algorithms on continuous actions.
    EpsilonGreedyPolicy  argmax_a Q(x, a), replaced by a uniform action with each env's
                         own probability epsilon (Ape-X's spread of epsilons, or a
                         schedule). R2D2, Ape-X, the DQN family.
    SquashedPolicy       tanh of a Gaussian draw (SAC) or of a deterministic action plus
                         Gaussian noise (DDPG, TD3), scaled to the env's bounds.

Both write into the engine's fixed arrays: float32 outputs are copied by numpy when
they are float32 CPU tensors (cheaper than torch's dispatch, which runs cold after
env steps), else by torch (bf16 outputs of an autocast forward pass, other devices);
actions are drawn on the CPU by native code or numpy, whatever the model's device.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import Tensor

from beast.algos.base import ActingRule
from beast.fields import Field
from beast.native.acting import SoftmaxSampler

__all__ = [
    "CategoricalPolicy",
    "EpsilonGreedyPolicy",
    "GaussianPolicy",
    "SquashedPolicy",
    "actor_epsilons",
    "copy_output",
]


def copy_output(out: np.ndarray, value: Tensor) -> None:
    """Copy a model output for n envs (`[n, ...]`, any dtype and device) into the float32
    array `out` ([n, ...])."""
    if value.device.type == "cpu" and value.dtype == torch.float32:
        np.copyto(out, value.detach().numpy())
    else:
        with torch.no_grad():
            torch.from_numpy(out).copy_(value)


def _seed_from_torch() -> int:
    """64 random bits from torch's global generator (actors seed torch per process)."""
    return int(torch.randint(0, 2**63 - 1, (), dtype=torch.int64))


class CategoricalPolicy(ActingRule):
    """Sample from softmax(policy_logits); store the logits and the baseline.

    Model outputs: policy_logits [1, n, A], baseline [1, n]. Record: action int64,
    policy_logits float32 [A], baseline float32. The draw is native
    (`beast.native.acting.SoftmaxSampler`: inverse CDF in float64). With `explore=False`
    (--mode test, --eval_interval) the action is the most probable one (the first on a
    tie): evaluation is deterministic, as SB3's `deterministic=True` and the Gaussian
    policy's mean action are.
    """

    def __init__(self, num_actions: int, *, explore: bool = True) -> None:
        self.num_actions, self.explore = num_actions, explore

    def record_spec(self) -> dict[str, Field]:
        return {
            "action": Field((), torch.int64),
            "policy_logits": Field((self.num_actions,), torch.float32),
            "baseline": Field((), torch.float32),
        }

    def bind(
        self, record: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> Callable[[Mapping[str, Tensor]], None]:
        logits, baseline, actions = record["policy_logits"], record["baseline"], record["action"]
        sampler = SoftmaxSampler(logits, actions) if self.explore else None

        def act(outputs: Mapping[str, Tensor]) -> None:
            copy_output(logits, outputs["policy_logits"][0])
            copy_output(baseline, outputs["baseline"][0])
            if sampler is None:
                np.argmax(logits, axis=1, out=actions)
            else:
                sampler.sample()

        return act

    def deterministic_action(self, outputs: Mapping[str, Tensor]) -> Tensor:
        """argmax_a policy_logits (the first on a tie, as np.argmax): int64 [n]."""
        return outputs["policy_logits"][0].float().argmax(dim=1)


class GaussianPolicy(ActingRule):
    """Draw from a diagonal Gaussian; store its parameters and the baseline.

    Model outputs: action_mean [1, n, d], action_log_std [1, n, d], baseline [1, n].
    Record: action float32 [d] (the draw itself, unclipped: env batches clip what the env
    gets, and the learner takes log pi of the draw), action_mean and action_log_std float32
    [d], baseline float32. With `explore=False` (--mode test) the action is the mean.

    Random numbers come from a numpy generator seeded from torch's global generator at
    `bind`, as EpsilonGreedyPolicy's.
    """

    def __init__(self, dim: int, *, explore: bool = True) -> None:
        self.dim, self.explore = dim, explore

    def record_spec(self) -> dict[str, Field]:
        return {
            "action": Field((self.dim,), torch.float32),
            "action_mean": Field((self.dim,), torch.float32),
            "action_log_std": Field((self.dim,), torch.float32),
            "baseline": Field((), torch.float32),
        }

    def bind(
        self, record: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> Callable[[Mapping[str, Tensor]], None]:
        actions, mean, log_std = record["action"], record["action_mean"], record["action_log_std"]
        baseline, explore = record["baseline"], self.explore
        noise = np.zeros_like(actions)
        rng = np.random.default_rng(_seed_from_torch())

        def act(outputs: Mapping[str, Tensor]) -> None:
            copy_output(mean, outputs["action_mean"][0])
            copy_output(log_std, outputs["action_log_std"][0])
            copy_output(baseline, outputs["baseline"][0])
            if not explore:
                np.copyto(actions, mean)
                return
            rng.standard_normal(out=noise, dtype=np.float32)
            np.exp(log_std, out=actions)
            np.multiply(actions, noise, out=actions)
            np.add(actions, mean, out=actions)

        return act

    def deterministic_action(self, outputs: Mapping[str, Tensor]) -> Tensor:
        """The Gaussian's mean, unclipped: float32 [n, d]."""
        return outputs["action_mean"][0].float()


class SquashedPolicy(ActingRule):
    """Actions squashed into the unit box by tanh, then scaled to the env's bounds.

    Model outputs: action_mean [1, n, d] (before the tanh), with `stochastic` also
    action_log_std [1, n, d], and with `scheduled` an epsilon [1, n]
    (`beast.algos.transitions.ExplorationSchedule`): the probability of a uniform random action in
    the box instead (1 while --learning_starts fills the replay, then 0). Record: action
    float32 [d], in the env's units.

    In the unit box, exploring:
        stochastic (SAC)     a = tanh(m + s * eps)
        deterministic        a = clip(tanh(m) + noise * eps, -1, 1)   (DDPG, TD3)
    with eps standard normal; not exploring (--mode test): a = tanh(m). The env then gets
    ``low + (a + 1) (high - low) / 2`` (beast/algos/qpg/functions.py `from_unit_actions`).
    Random numbers come from a numpy generator seeded from torch's, as the other policies'.
    """

    def __init__(
        self,
        low: tuple[float, ...],
        high: tuple[float, ...],
        *,
        stochastic: bool,
        noise: float = 0.0,
        scheduled: bool = False,
        explore: bool = True,
    ) -> None:
        self.low, self.high = low, high
        self.stochastic, self.noise = stochastic, noise
        self.scheduled, self.explore = scheduled and explore, explore

    def record_spec(self) -> dict[str, Field]:
        return {"action": Field((len(self.low),), torch.float32)}

    def bind(
        self, record: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> Callable[[Mapping[str, Tensor]], None]:
        actions = record["action"]
        n, dim = actions.shape
        low = np.asarray(self.low, dtype=np.float32)
        half_range = 0.5 * (np.asarray(self.high, dtype=np.float32) - low)
        mean = np.zeros((n, dim), dtype=np.float32)
        log_std = np.zeros((n, dim), dtype=np.float32)
        noise = np.zeros((n, dim), dtype=np.float32)
        epsilon = np.zeros(n, dtype=np.float32)
        stochastic, scale = self.stochastic, self.noise
        explore, scheduled = self.explore, self.scheduled
        rng = np.random.default_rng(_seed_from_torch())

        def act(outputs: Mapping[str, Tensor]) -> None:
            copy_output(mean, outputs["action_mean"][0])
            unit = mean
            if explore and stochastic:
                copy_output(log_std, outputs["action_log_std"][0])
                rng.standard_normal(out=noise, dtype=np.float32)
                np.exp(log_std, out=log_std)
                np.multiply(log_std, noise, out=noise)
                np.add(mean, noise, out=noise)
                unit = noise
            np.tanh(unit, out=actions)
            if explore and not stochastic and scale > 0:
                rng.standard_normal(out=noise, dtype=np.float32)
                actions[...] = np.clip(actions + scale * noise, -1.0, 1.0)
            if scheduled:
                copy_output(epsilon, outputs["epsilon"][0])
                uniform = rng.random(n) < epsilon
                if uniform.any():
                    actions[uniform] = rng.uniform(-1.0, 1.0, size=(int(uniform.sum()), dim))
            np.add(actions, 1.0, out=actions)
            np.multiply(actions, half_range, out=actions)
            np.add(actions, low, out=actions)

        return act

    def deterministic_action(self, outputs: Mapping[str, Tensor]) -> Tensor:
        """``low + (tanh(m) + 1) (high - low) / 2``, the arithmetic in `bind`'s order:
        float32 [n, d] in the env's units."""
        low = torch.tensor(self.low, dtype=torch.float32)
        half_range = 0.5 * (torch.tensor(self.high, dtype=torch.float32) - low)
        unit = torch.tanh(outputs["action_mean"][0].float())
        return (unit + 1.0) * half_range + low


def actor_epsilons(num_envs: int, eps_base: float = 0.4, alpha: float = 7.0) -> np.ndarray:
    """Per-env exploration rates ``eps_i = eps_base ** (1 + alpha * i / (N - 1))``: float32 [N].

    Ape-X section 4.1 (and R2D2): a fixed spread of epsilons across actors rather than
    one annealed schedule, so some always explore and some act nearly greedily. N counts
    every env that acts with its own epsilon (all envs of all actors). With N = 1 the
    exponent is taken as 1 (the i = 0 end of the spread): eps_base.

    Returns:
        N values, from eps_base (i = 0) down to eps_base ** (1 + alpha).
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    if not 0.0 <= eps_base <= 1.0:
        raise ValueError(f"eps_base must be in [0, 1], got {eps_base}")
    if num_envs == 1:
        return np.array([eps_base], dtype=np.float32)
    exponents = 1.0 + alpha * np.arange(num_envs, dtype=np.float64) / (num_envs - 1)
    return (eps_base**exponents).astype(np.float32)


class EpsilonGreedyPolicy(ActingRule):
    """Greedy in Q(x, .), each env exploring uniformly with its own epsilon.

    Model outputs: q_values [1, n, A], or with a `support` (C51, Rainbow) q_logits
    [1, n, A, N] whose expectation over the support's N atoms is Q. Record: action int64.

    Epsilons, per env: from `actor_epsilons(N, eps_base, eps_alpha)` over the run's N envs
    (Ape-X's spread, constant), or one `epsilon` for every env (--mode test's small
    epsilon, so that a deterministic policy cannot stall an episode forever), or, with
    `scheduled`, the model's own output epsilon [1, n]: a schedule the learner advances
    and publishes with the weights (`beast.algos.transitions.ExplorationSchedule`), so local
    actors, the central server and polybeast's env servers all follow it.

    Random numbers come from a numpy generator seeded from torch's global generator at
    `bind`, so `torch.manual_seed` in each actor makes acting reproducible.
    """

    def __init__(
        self,
        num_actions: int,
        *,
        eps_base: float = 0.4,
        eps_alpha: float = 7.0,
        epsilon: float | None = None,
        scheduled: bool = False,
        support: tuple[float, ...] | None = None,
    ) -> None:
        self.num_actions = num_actions
        self.eps_base, self.eps_alpha, self.epsilon = eps_base, eps_alpha, epsilon
        self.scheduled = scheduled and epsilon is None
        self.support = support

    def record_spec(self) -> dict[str, Field]:
        return {"action": Field((), torch.int64)}

    def env_params(self, num_envs: int) -> dict[str, np.ndarray]:
        if self.scheduled:
            return {}  # every env follows the one schedule the model outputs
        if self.epsilon is not None:
            return {"epsilon": np.full(num_envs, self.epsilon, dtype=np.float32)}
        return {"epsilon": actor_epsilons(num_envs, self.eps_base, self.eps_alpha)}

    def bind(
        self, record: Mapping[str, np.ndarray], params: Mapping[str, np.ndarray]
    ) -> Callable[[Mapping[str, Tensor]], None]:
        actions = record["action"]
        epsilons = None if self.scheduled else params["epsilon"]
        n, num_actions = len(actions), self.num_actions
        q_values = np.zeros((n, num_actions), dtype=np.float32)
        scheduled = np.zeros(n, dtype=np.float32) if self.scheduled else None
        support = None if self.support is None else torch.tensor(self.support)
        rng = np.random.default_rng(_seed_from_torch())

        def act(outputs: Mapping[str, Tensor]) -> None:
            if support is None:
                copy_output(q_values, outputs["q_values"][0])
            else:
                probs = outputs["q_logits"][0].float().softmax(dim=-1)
                copy_output(q_values, probs @ support.to(probs.device))
            eps = epsilons
            if scheduled is not None:
                copy_output(scheduled, outputs["epsilon"][0])
                eps = scheduled
            greedy = q_values.argmax(axis=1)
            explore = rng.random(n) < eps
            np.copyto(actions, np.where(explore, rng.integers(num_actions, size=n), greedy))

        return act

    def deterministic_action(self, outputs: Mapping[str, Tensor]) -> Tensor:
        """argmax_a Q(x, a) (the first on a tie, as np.argmax), with no epsilon: int64 [n]."""
        if self.support is None:
            q_values = outputs["q_values"][0].float()
        else:
            probs = outputs["q_logits"][0].float().softmax(dim=-1)
            q_values = probs @ torch.tensor(self.support, dtype=probs.dtype)
        return q_values.argmax(dim=1)
