"""What an IMPALA actor writes into its rollout slots, checked against a replay.

Real actor processes (through `tests/support/acting.py`'s `capture_rollouts`, which starts
them as a run does) fill slots; the test then replays each env from its seed with the actions
the slots recorded, following the env batch's auto-reset rules (beast/envs/batch.py),
and checks every observation, reward, done / terminated / truncated flag, last action
and episode statistic, and recomputes the logits and baselines with the acting model.
With lanes (--num_env_splits) each lane's envs post and step in turn; the slots must
not tell the difference.
"""

from collections import defaultdict

import numpy as np
import pytest
import torch

from beast import envs
from beast.fields import core_state
from beast.models import build_model
from tests.support.acting import capture_rollouts

ENV = "CartPole-v1"
NUM_ENVS = 4
UNROLL = 7
ROLLOUTS = 5 * NUM_ENVS  # five consecutive rollouts of each env


@pytest.mark.parametrize(
    ("policy", "num_env_splits"), [("local", 1), ("central", 1), ("central", 2), ("local", 2)]
)
def test_slots_hold_exactly_what_the_envs_and_model_produced(policy, num_env_splits):
    torch.manual_seed(0)
    model = build_model("auto", (4,), 2)
    batch = capture_rollouts(
        env=ENV,
        num_envs=NUM_ENVS,
        unroll_length=UNROLL,
        count=ROLLOUTS,
        actor_model=model,
        seed=10,
        policy=policy,
        num_env_splits=num_env_splits,
    )
    assert core_state(batch) == ()  # no LSTM: no recurrent state stored
    ids = batch["rollout_id"]
    assert bool((ids == ids[0]).all()), "a slot holds steps of two rollouts"
    # Low 32 bits of an id: rollout number * K + env index (beast/acting/actor.py).
    by_env = defaultdict(list)
    for column, rollout_id in enumerate(ids[0].tolist()):
        counter = rollout_id & 0xFFFFFFFF
        by_env[counter % NUM_ENVS].append((counter // NUM_ENVS, column))
    assert sorted(by_env) == list(range(NUM_ENVS))

    for env_index, rollouts in by_env.items():
        rollouts.sort()
        assert [n for n, _ in rollouts] == list(range(len(rollouts))), "a rollout is missing"
        env = envs.make(ENV, seed=10 + env_index)  # the actor's seeds: seed + env index
        obs, _ = env.reset()
        episode_return, episode_length = 0.0, 0
        truncated = False  # the previous row was a time-limited episode's final observation
        last_row = None
        for _, column in rollouts:
            get = {key: value[:, column] for key, value in batch.items()}
            np.testing.assert_array_equal(get["obs"][0].numpy(), obs)
            if last_row is None:  # the first row of all starts an episode
                assert bool(get["done"][0]) and not bool(get["terminated"][0])
                assert not bool(get["truncated"][0])
            else:  # row 0 repeats the previous rollout's last row
                for key, value in last_row.items():
                    if key != "rollout_id":
                        assert torch.equal(get[key][0], value), key
            for t in range(UNROLL):
                action = int(get["action"][t])
                if truncated:
                    # No action is taken from a final observation: the env resets.
                    obs, _ = env.reset()
                    reward, done, episode_end = 0.0, True, False
                    terminated = truncated = False
                else:
                    obs, reward, terminated, truncated, _ = env.step(action)
                    episode_return += reward
                    episode_length += 1
                    truncated = truncated and not terminated
                    done, episode_end = terminated, terminated or truncated
                    if terminated:  # the row holds the next episode's first observation
                        obs, _ = env.reset()
                step = t + 1
                np.testing.assert_array_equal(get["obs"][step].numpy(), obs)
                assert float(get["reward"][step]) == reward
                assert bool(get["done"][step]) == done
                assert bool(get["terminated"][step]) == terminated
                assert bool(get["truncated"][step]) == truncated
                assert int(get["last_action"][step]) == action
                assert bool(get["episode_end"][step]) == episode_end
                if episode_end:
                    assert float(get["episode_return"][step]) == episode_return
                    assert int(get["episode_step"][step]) == episode_length
                    episode_return, episode_length = 0.0, 0
            last_row = {key: value[UNROLL] for key, value in get.items()}
        env.close()

    # The outputs stored with each step are the model's on that step's inputs.
    inputs = {key: batch[key] for key in ("obs", "reward", "done", "last_action")}
    with torch.no_grad():
        output, _ = model(inputs, ())
    torch.testing.assert_close(batch["policy_logits"], output.policy_logits)
    torch.testing.assert_close(batch["baseline"], output.baseline)
    assert set(batch["action"].unique().tolist()) <= {0, 1}
