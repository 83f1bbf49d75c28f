"""Independent references of beast's numerics, written from the papers as plain loops
(none calls beast): each algorithm's tests check against them (tests/algos/test_*.py), and
so do the dtype tests (tests/algos/test_numerics_dtypes.py)."""

from __future__ import annotations

import decimal
import math

import numpy as np

# The value-rescaling references compute in decimal, to 50 digits.
D = decimal.Decimal
decimal.getcontext().prec = 50


def reference_projection(returns, discounts, terminal, probs, v_min, v_max):
    """Algorithm 1 as a per-atom Python loop, in float64."""
    num_atoms = len(probs[0])
    dz = (v_max - v_min) / (num_atoms - 1)
    support = [v_min + j * dz for j in range(num_atoms)]
    out = []
    for g, discount, done, p in zip(returns, discounts, terminal, probs, strict=True):
        m = [0.0] * num_atoms
        for j in range(num_atoms):
            tz = g + (0.0 if done else discount) * support[j]
            tz = min(max(tz, v_min), v_max)
            b = (tz - v_min) / dz
            lo, up = math.floor(b), math.ceil(b)
            m[lo] += p[j] * (up - b)
            m[up] += p[j] * (b - lo)
            if lo == up:
                m[lo] += p[j]
        out.append(m)
    return out


def gae_reference(rewards, values, terminated, truncated, gamma, lam):
    """Per env, per step, straight from Schulman et al. 2016, eq. 16: A_t is the sum of
    (gamma lambda)^l delta_{t+l} over the rest of the episode within the rollout, where
    delta_k = r_k + gamma V(x_{k+1}) [0 after a termination] - V(x_k). The sum stops
    after a terminal transition, and before a step that is no transition (a truncated
    episode's final observation, whose own delta bootstrapped the step before). Loops,
    float64, no vectorisation: nothing shared with the code under test."""
    T, B = rewards.shape
    advantages = np.zeros((T, B))
    for b in range(B):
        for t in range(T):
            if truncated[t, b]:
                continue  # no action is taken from a final observation
            total, weight = 0.0, 1.0
            for k in range(t, T):
                if truncated[k, b]:
                    break
                bootstrap = 0.0 if terminated[k, b] else gamma * values[k + 1, b]
                delta = rewards[k, b] + bootstrap - values[k, b]
                total += weight * delta
                if terminated[k, b]:
                    break
                weight *= gamma * lam
            advantages[t, b] = total
    return advantages


def random_episode_ends(rng, T, B):
    """Terminations and truncations laid out as env batches produce them: a truncated
    row (the final observation) is followed by a reset row; a termination's next row
    is already the next episode's first."""
    terminated = np.zeros((T, B), dtype=bool)
    truncated = np.zeros((T + 1, B), dtype=bool)
    for b in range(B):
        t = 0
        while t < T:
            draw = rng.random()
            if draw < 0.08:
                terminated[t, b] = True
            elif draw < 0.16 and t + 1 <= T:
                truncated[t + 1, b] = True  # x_{t+1} is final; t+1 is no transition
                t += 1
            t += 1
    return terminated, truncated


def implied_kl_by_quadrature(mu, sigma_mu, pi, sigma_pi, rho_bar):
    """KL(pi || pi~) for 1-D Gaussians by the trapezoid rule on a fine grid:
    pi~(a) = min(rho_bar mu(a), pi(a)) / Z (LASER, section 4.3)."""
    a = np.linspace(pi - 12 * sigma_pi, pi + 12 * sigma_pi, 200_001)

    def density(mean, std):
        return np.exp(-0.5 * ((a - mean) / std) ** 2) / (std * math.sqrt(2 * math.pi))

    p = density(pi, sigma_pi)
    m = np.minimum(rho_bar * density(mu, sigma_mu), p)
    z = np.trapezoid(m, a)
    integrand = np.where(p > 0, p * (np.log(p + 1e-300) - np.log(m / z + 1e-300)), 0.0)
    return float(np.trapezoid(integrand, a))


def reference_tanh_gaussian_log_prob(u, mean, log_std):
    """sum_i log N(u_i; m_i, s_i) - log(1 - tanh(u_i)^2), one element at a time."""
    total = 0.0
    for u_i, m_i, ls_i in zip(u, mean, log_std, strict=True):
        s = math.exp(ls_i)
        gaussian = -((u_i - m_i) ** 2) / (2 * s * s) - math.log(s) - 0.5 * math.log(2 * math.pi)
        total += gaussian - math.log(1.0 - math.tanh(u_i) ** 2)
    return total


def h_reference(x: float, eps: float) -> D:
    """h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x, literally, in decimal."""
    dx, de = D(x), D(eps)
    sign = (dx > 0) - (dx < 0)
    return sign * ((abs(dx) + 1).sqrt() - 1) + de * dx


def h_inverse_reference(x: float, eps: float) -> D:
    """Pohlen et al. 2018, proposition A.2, literally, in decimal:
    h^-1(x) = sign(x)(((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1),
    and sign(x)((|x| + 1)^2 - 1) for eps = 0."""
    dx, de = D(x), D(eps)
    sign = (dx > 0) - (dx < 0)
    if eps == 0:
        return sign * ((abs(dx) + 1) ** 2 - 1)
    root = (1 + 4 * de * (abs(dx) + 1 + de)).sqrt()
    return sign * (((root - 1) / (2 * de)) ** 2 - 1)


def targets_reference(
    online_q, target_q, rewards, terminated, truncated, mask, n_step, gamma, eps, truncate_at_end
):
    """R2D2 section 2 with episode ends, one (t, b) at a time:

    y_t = h(sum_{k=0}^{m-1} gamma^k r_{t+k} + [not terminated] gamma^m h^-1(Q-(x_{t+m}, a*)))

    with a* = argmax Q(x_{t+m}), r_{t+k} = rewards[t + k + 1] (the reward of the
    transition out of row t + k), m = n, or fewer when an episode ends: by termination
    (no bootstrap), by truncation (bootstrap from the truncated row, the episode's final
    observation), or when the sequence does. Returns (targets, valid) as nested lists.
    """
    num_rows, batch = len(rewards), len(rewards[0])

    def h(x):
        return x if eps is None else float(h_reference(x, eps))

    def h_inv(x):
        return x if eps is None else float(h_inverse_reference(x, eps))

    targets = [[0.0] * batch for _ in range(num_rows)]
    valid = [[False] * batch for _ in range(num_rows)]
    for b in range(batch):
        for t in range(num_rows):
            if not mask[t][b]:
                continue
            total, steps, ended, cut = 0.0, 0, False, False
            for k in range(n_step):
                row = t + k + 1
                if row >= num_rows:
                    break
                total += gamma**k * rewards[row][b]
                steps = k + 1
                if terminated[row][b]:
                    ended = True
                    break
                if truncated[row][b]:
                    cut = True
                    break
            complete = steps == n_step or ended or cut
            if steps == 0 or (not truncate_at_end and not complete):
                continue
            if not ended:
                s = t + steps
                q_online = online_q[s][b]
                best = max(range(len(q_online)), key=lambda a: (q_online[a], -a))
                total += gamma**steps * h_inv(target_q[s][b][best])
            targets[t][b] = h(total)
            valid[t][b] = True
    return targets, valid


def builder_like_batch(num_rows, batch, num_actions, rng, *, episode_end_prob=0.15):
    """Columns as SequenceBuilder writes them: real rows (mask), and at an episode end a
    terminal row (no mask), terminated or truncated at random, followed by padding
    (done and terminated, no mask). Returns online and target Q, rewards, terminated,
    truncated and mask."""
    rewards = rng.normal(0.0, 1.0, (num_rows, batch))
    terminated = np.zeros((num_rows, batch), dtype=bool)
    truncated = np.zeros((num_rows, batch), dtype=bool)
    mask = np.ones((num_rows, batch), dtype=bool)
    for b in range(batch):
        for t in range(1, num_rows):
            if rng.random() < episode_end_prob:
                if rng.random() < 0.5:
                    truncated[t, b] = True
                    terminated[t + 1 :, b] = True
                else:
                    terminated[t:, b] = True
                mask[t:, b] = False
                rewards[t + 1 :, b] = 0.0
                break
    online_q = rng.normal(0.0, 2.0, (num_rows, batch, num_actions))
    target_q = rng.normal(0.0, 2.0, (num_rows, batch, num_actions))
    return online_q, target_q, rewards, terminated, truncated, mask


def priorities_reference(td, valid, eta):
    """eta * max |td| + (1 - eta) * mean |td| over a column's valid steps; 0 if none."""
    out = []
    for b in range(len(td[0])):
        values = [abs(td[t][b]) for t in range(len(td)) if valid[t][b]]
        out.append(eta * max(values) + (1 - eta) * sum(values) / len(values) if values else 0.0)
    return out


def loss_reference(online_q, target_q, batch, weights, burn_in, n_step, gamma, eps, eta):
    """mean_b w_b * mean_{valid t >= burn_in} 0.5 (y_t - Q(x_t, a_t))^2, and priorities."""
    sl = slice(burn_in, None)
    targets, valid = targets_reference(
        online_q[sl].tolist(),
        target_q[sl].tolist(),
        batch["reward"][sl].tolist(),
        batch["terminated"][sl].tolist(),
        batch["truncated"][sl].tolist(),
        batch["mask"][sl].tolist(),
        n_step,
        gamma,
        eps,
        True,
    )
    q, actions = online_q[sl].tolist(), batch["action"][sl].tolist()
    num_rows, num_b = len(targets), len(weights)
    total, td = 0.0, [[0.0] * num_b for _ in range(num_rows)]
    for b in range(num_b):
        errors = []
        for t in range(num_rows):
            if valid[t][b]:
                td[t][b] = targets[t][b] - q[t][b][actions[t][b]]
                errors.append(0.5 * td[t][b] ** 2)
        if errors:
            total += weights[b] * sum(errors) / len(errors)
    return total / num_b, priorities_reference(td, valid, eta)


def vtrace_reference(
    log_rhos,
    discounts,
    rewards,
    values,
    bootstrap_value,
    clip_rho_threshold,
    clip_pg_rho_threshold,
    lambda_,
    clip_c_threshold,
):
    """IMPALA eq. 1 and section 4.2 taken literally, in float64.

    v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t V,
    with gamma^{t-s} generalised to the product of per-step discounts.

    Returns (vs, pg_advantages, vs_scale, pg_scale); the scales are the sums
    of absolute values of the terms that make up each output, which bound
    the rounding error of any float32 evaluation order.
    """
    log_rhos, discounts, rewards, values, bootstrap_value = (
        np.asarray(x, dtype=np.float64)
        for x in (log_rhos, discounts, rewards, values, bootstrap_value)
    )
    num_steps = log_rhos.shape[0]
    rhos = np.exp(log_rhos)
    rho = rhos if clip_rho_threshold is None else np.minimum(clip_rho_threshold, rhos)
    c = lambda_ * (rhos if clip_c_threshold is None else np.minimum(clip_c_threshold, rhos))
    pg_rho = rhos if clip_pg_rho_threshold is None else np.minimum(clip_pg_rho_threshold, rhos)
    # V(x_0), ..., V(x_T).
    all_values = np.concatenate([values, bootstrap_value[None]])

    vs = np.empty_like(all_values)
    vs_scale = np.empty_like(all_values)
    vs[num_steps] = bootstrap_value
    vs_scale[num_steps] = np.abs(bootstrap_value)
    for s in range(num_steps):
        total = all_values[s].copy()
        scale = np.abs(all_values[s])
        for t in range(s, num_steps):
            trace = np.ones_like(total)
            for i in range(s, t):
                trace = trace * discounts[i] * c[i]
            delta_t = rho[t] * (rewards[t] + discounts[t] * all_values[t + 1] - all_values[t])
            delta_t_abs = np.abs(rho[t]) * (
                np.abs(rewards[t])
                + np.abs(discounts[t] * all_values[t + 1])
                + np.abs(all_values[t])
            )
            total = total + trace * delta_t
            scale = scale + np.abs(trace) * delta_t_abs
        vs[s] = total
        vs_scale[s] = scale

    pg_advantages = pg_rho * (rewards + discounts * vs[1:] - values)
    pg_scale = pg_rho * (np.abs(rewards) + np.abs(discounts) * vs_scale[1:] + np.abs(values))
    return vs[:num_steps], pg_advantages, vs_scale[:num_steps], pg_scale


def numpy_log_softmax(logits):
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
