"""Central inference (beast/acting/inference.py): the request table, the actor's side, the server.

The native Batcher's own contract (every request answered once, wakes, resets,
close, killed actors) is tested in test_batcher.py; these tests cover what the
inference layer adds: inputs and outputs travelling through the table, recurrent
state kept per env across batches, weight refreshes, and actor processes that
outlive their server or die mid-request.
"""

import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
import torch

from beast.acting.actor import ERROR_BOARD_BYTES, ActorSettings, run_actor
from beast.acting.inference import (
    CentralInference,
    InferenceTable,
    LocalInference,
)
from beast.algos.policies import CategoricalPolicy, EpsilonGreedyPolicy
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.fields import box_obs, core_state_shapes
from beast.models import AgentOutput, build_model, build_q_model
from beast.native import QueueClosed
from tests.support.central import NUM_ACTIONS, OBS_SHAPE, POLICY, make_server, make_table
from tests.support.runs import (
    CARTPOLE_SMALL,
    actor_pids,
    read_csv,
    shm_entries,
    start,
    wait_for_rows,
    wait_until_gone,
)


def tensors(record: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """A policy's record (numpy arrays it overwrites every step) as tensor copies."""
    return {key: torch.from_numpy(value.copy()) for key, value in record.items()}


def recurrent_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model("mlp", OBS_SHAPE, NUM_ACTIONS, use_lstm=True, hidden_size=16).eval()


def random_inputs(rng: torch.Generator, num_envs: int, t: int) -> dict[str, torch.Tensor]:
    return {
        "obs": torch.randn((num_envs, *OBS_SHAPE), generator=rng),
        "reward": torch.randn(num_envs, generator=rng),
        # Some envs start new episodes mid-sequence: the state must reset for exactly those.
        "done": torch.rand(num_envs, generator=rng) < (1.0 if t == 0 else 0.2),
        "last_action": torch.randint(NUM_ACTIONS, (num_envs,), generator=rng),
    }


def atari_inputs(num_envs: int, first: bool) -> dict[str, torch.Tensor]:
    """Random frames for AtariNet; `first` starts every env's episode."""
    return {
        "obs": torch.randint(0, 256, (num_envs, 4, 84, 84), dtype=torch.uint8),
        "reward": torch.zeros(num_envs),
        "done": torch.full((num_envs,), first),
        "last_action": torch.zeros(num_envs, dtype=torch.int64),
    }


@pytest.mark.parametrize("use_lstm", [False, True])
def test_local_policy_in_bf16_stays_close_to_fp32(use_lstm):
    """Actors of a bf16 run act under bf16 autocast: the behaviour logits they store
    for V-trace stay within bf16's rounding of the fp32 ones, and an LSTM's state
    stays float32 from step to step (the rollout slots store it as float32)."""
    torch.manual_seed(0)
    model = build_model("atari", (4, 84, 84), 6, use_lstm=use_lstm).eval()
    policy = CategoricalPolicy(6)
    fp32, bf16 = LocalInference(model, policy, 3), LocalInference(model, policy, 3, bf16=True)
    for t in range(3):
        inputs = atari_inputs(3, first=t == 0)
        expected, got = tensors(fp32.act(inputs)), tensors(bf16.act(inputs))
        assert not torch.equal(got["policy_logits"], expected["policy_logits"])  # autocast ran
        torch.testing.assert_close(
            got["policy_logits"], expected["policy_logits"], atol=0.02, rtol=0.02
        )
        torch.testing.assert_close(got["baseline"], expected["baseline"], atol=0.02, rtol=0.02)
        assert got["action"].dtype == torch.int64 and got["action"].shape == (3,)
        assert all(s.dtype == torch.float32 for s in bf16.state)
        for g, e in zip(bf16.state, fp32.state, strict=True):
            torch.testing.assert_close(g, e, atol=0.02, rtol=0.02)


def test_central_policy_in_bf16_stays_close_to_fp32(watchdog):
    """A bf16 run's inference server forwards under bf16 autocast; what it writes
    back (logits, baselines, the LSTM state kept per row) stays float32 and within
    bf16's rounding of an fp32 local policy's."""
    torch.manual_seed(0)
    model = build_model("atari", (4, 84, 84), 6, use_lstm=True).eval()
    policy = CategoricalPolicy(6)
    table = InferenceTable(
        num_actors=1,
        num_envs=2,
        obs=box_obs((4, 84, 84), np.uint8),
        policy=policy,
        initial_state=model.initial_state(1),
    )
    server = make_server(
        table,
        build_model("atari", (4, 84, 84), 6, use_lstm=True),
        model,
        bf16=True,
        policy=policy,
    )
    server.start()
    try:
        central, local = CentralInference(table, 0, lambda: True), LocalInference(model, policy, 2)
        for t in range(3):
            inputs = atari_inputs(2, first=t == 0)
            expected, got = tensors(local.act(inputs)), tensors(central.act(inputs))
            assert got["policy_logits"].dtype == torch.float32
            assert not torch.equal(got["policy_logits"], expected["policy_logits"])  # autocast
            torch.testing.assert_close(
                got["policy_logits"], expected["policy_logits"], atol=0.02, rtol=0.02
            )
            for g, e in zip(central.state, local.state, strict=True):
                assert g.dtype == torch.float32
                torch.testing.assert_close(g, e, atol=0.02, rtol=0.02)
    finally:
        table.close()
        server.stop()
    assert server.error is None


def test_central_policy_gives_the_local_policy_outputs_and_states(watchdog):
    """Two actors' envs through one server: per-env logits, baselines and recurrent
    states equal the actor-side model's, step after step, whatever batch serves them."""
    model = recurrent_model()
    num_actors, num_envs = 2, 3
    table = make_table(model, num_actors, num_envs)
    server = make_server(table, recurrent_model(seed=1), source=model)  # synced at start
    server.start()
    try:
        local = [LocalInference(model, POLICY, num_envs) for _ in range(num_actors)]
        central = [CentralInference(table, i, lambda: True) for i in range(num_actors)]
        rng = torch.Generator().manual_seed(0)
        for t in range(12):
            for i in range(num_actors):
                inputs = random_inputs(rng, num_envs, t)
                expected = tensors(local[i].act(inputs))
                got = tensors(central[i].act(inputs))
                torch.testing.assert_close(got["policy_logits"], expected["policy_logits"])
                torch.testing.assert_close(got["baseline"], expected["baseline"])
                assert got["action"].shape == (num_envs,)
                assert got["action"].dtype == torch.int64
                # The state that produced this output, per env: what a rollout stores.
                for g, e in zip(central[i].state, local[i].state, strict=True):
                    torch.testing.assert_close(g, e)
    finally:
        table.close()
        server.stop()
    assert server.error is None
    assert server.stats.requests == 12 * num_actors * num_envs
    assert server.stats.serving_seconds > 0
    summary = server.stats.summary()
    assert f"{server.stats.batches:,} batches of {server.stats.mean_batch:.1f} envs" in summary


def test_central_q_policy_keeps_per_env_epsilon_and_state_on_the_server(watchdog):
    """SEED RL's R2D2 on the server: the table holds each env's epsilon (Ape-X's spread
    over all envs) and recurrent state. With epsilons 0 and 1 alternating, the greedy
    rows get the actor-side Q-network's argmax, the others explore, and every row's
    state is the local model's."""
    torch.manual_seed(0)
    model = build_q_model("mlp", OBS_SHAPE, NUM_ACTIONS, use_lstm=True, hidden_size=16).eval()

    class Alternating(EpsilonGreedyPolicy):
        def env_params(self, num_envs):
            return {"epsilon": np.tile(np.array([0.0, 1.0], dtype=np.float32), num_envs // 2)}

    policy = Alternating(NUM_ACTIONS)
    num_actors, num_envs = 2, 4
    table = InferenceTable(
        num_actors=num_actors,
        num_envs=num_envs,
        obs=box_obs(OBS_SHAPE, np.float32),
        policy=policy,
        initial_state=model.initial_state(1),
    )
    assert table.params["epsilon"].tolist() == [0.0, 1.0] * 4
    own = build_q_model("mlp", OBS_SHAPE, NUM_ACTIONS, use_lstm=True, hidden_size=16)
    server = make_server(table, own, model, policy=policy)
    server.start()
    explored = 0
    try:
        central = [CentralInference(table, i, lambda: True) for i in range(num_actors)]
        greedy = [LocalInference(model, EpsilonGreedyPolicy(NUM_ACTIONS, epsilon=0.0), num_envs)]
        greedy.append(
            LocalInference(model, EpsilonGreedyPolicy(NUM_ACTIONS, epsilon=0.0), num_envs)
        )
        rng = torch.Generator().manual_seed(0)
        for t in range(20):
            for i in range(num_actors):
                inputs = random_inputs(rng, num_envs, t)
                expected = greedy[i].act(inputs)["action"].copy()
                got = central[i].act(inputs)["action"].copy()
                np.testing.assert_array_equal(got[0::2], expected[0::2])
                explored += int((got[1::2] != expected[1::2]).sum())
                for g, e in zip(central[i].state, greedy[i].state, strict=True):
                    torch.testing.assert_close(g, e)
    finally:
        table.close()
        server.stop()
    assert server.error is None
    # 80 uniform draws at epsilon 1 among 3 actions: about 53 differ from the greedy one.
    assert explored > 30


_COMPILE_BESIDE_BF16_SERVING = """
import threading
import torch
from torch import nn
from beast.acting.inference import forward_precision

torch.set_num_threads(1)


def net():
    return nn.Sequential(
        nn.Conv2d(4, 16, 8, 4), nn.ReLU(), nn.Flatten(), nn.Linear(16 * 20 * 20, 6)
    )


learner, server = net(), net()
x = torch.randn(8, 4, 84, 84)
stop = threading.Event()


def learn():  # as the learner thread: trace under torch.autocast, with gradients
    try:
        # The freeze is in dynamo's tracing, whatever the backend: "eager" needs no
        # C++ compiler and traces in about half a second.
        compiled = torch.compile(learner, backend="eager")
        for i in range(8):
            torch._dynamo.reset()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = compiled(x + i)
            y.float().sum().backward()
    finally:
        stop.set()


def serve():  # as an inference thread
    with torch.no_grad():
        while not stop.is_set():
            with forward_precision("cpu", True):
                assert server(x[:2]).dtype == torch.bfloat16


threads = [threading.Thread(target=learn), threading.Thread(target=serve)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("done")
"""


def test_bf16_serving_beside_a_compiling_learner_does_not_deadlock():
    """With `torch.autocast` as the serving context, this script froze (3 of 3 tries;
    passing, it takes about 5 s): the autocast exit cleared torch's shared cast cache
    under a mutex the tracing learner thread waited for while holding the GIL that the
    clearing needed."""
    out = subprocess.run(
        [sys.executable, "-c", _COMPILE_BESIDE_BF16_SERVING],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "done", out.stderr[-2000:]


def test_lanes_post_and_wait_in_turn_and_get_their_own_answers(watchdog):
    """An actor's envs in two lanes (--num_env_splits 2): lane 0 posts and, before it
    waits, lane 1 posts too; each lane's answer is the model's on its own envs."""
    model = recurrent_model()
    num_envs, splits = 4, 2
    lane_envs = num_envs // splits
    table = make_table(model, num_actors=2, num_envs=num_envs, num_env_splits=splits)
    assert table.batcher.num_groups == 4 and table.lane_envs == lane_envs
    assert table.rows(table.group(1, 1)) == slice(3 * lane_envs, 4 * lane_envs)
    server = make_server(table, recurrent_model(seed=1), source=model)
    server.start()
    try:
        lanes = [CentralInference(table, 1, lambda: True, split=s) for s in range(splits)]
        local = [LocalInference(model, POLICY, lane_envs) for _ in range(splits)]
        rng = torch.Generator().manual_seed(0)
        for t in range(6):
            inputs = [random_inputs(rng, lane_envs, t) for _ in range(splits)]
            for lane, lane_inputs in zip(lanes, inputs, strict=True):
                lane.post(lane_inputs)
            for s, (lane, lane_inputs) in enumerate(zip(lanes, inputs, strict=True)):
                expected = tensors(local[s].act(lane_inputs))
                got = tensors(lane.wait())
                torch.testing.assert_close(got["policy_logits"], expected["policy_logits"])
                for g, e in zip(lane.state, local[s].state, strict=True):
                    torch.testing.assert_close(g, e)
        # A dead actor's lanes are all dropped: a request left pending is not answered.
        server.stop()
        lanes[1].post(inputs[1])
        table.drop_requests(1)
        assert all(table.batcher.pending(table.group(1, s)) == 0 for s in range(splits))
        assert table.batcher.stats.dropped == lane_envs
    finally:
        table.close()
        server.stop()
    assert server.error is None
    with pytest.raises(ValueError, match="must divide num_envs"):
        make_table(model, num_actors=1, num_envs=3, num_env_splits=2)


def test_a_batch_with_gaps_between_rows_gets_each_rows_answer(watchdog):
    """Actors 0 and 2 of 3 post, actor 1 does not: each of the server's batches
    holds rows with a gap (gathered and scattered by index rather than served as
    one slice), and every env still gets the local model's outputs."""
    model = recurrent_model()
    num_envs, posting = 2, (0, 2)
    table = make_table(model, 3, num_envs)
    # The window outlasts both posts, so each step is served as one batch.
    server = make_server(table, recurrent_model(seed=1), source=model, batch_window=0.5)
    server.start()
    try:
        central = {i: CentralInference(table, i, lambda: True) for i in posting}
        local = {i: LocalInference(model, POLICY, num_envs) for i in posting}
        rng = torch.Generator().manual_seed(1)
        for t in range(3):
            inputs = {i: random_inputs(rng, num_envs, t) for i in posting}
            expected = {i: tensors(local[i].act(inputs[i])) for i in posting}
            got = {}
            threads = [
                threading.Thread(
                    target=lambda i=i, got=got, inputs=inputs: got.__setitem__(
                        i, tensors(central[i].act(inputs[i]))
                    )
                )
                for i in posting
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(10)
            for i in posting:
                torch.testing.assert_close(got[i]["policy_logits"], expected[i]["policy_logits"])
                torch.testing.assert_close(got[i]["baseline"], expected[i]["baseline"])
    finally:
        table.close()
        server.stop()
    assert server.error is None
    assert server.stats.batches == 3 and server.stats.requests == 3 * len(posting) * num_envs


def test_concurrent_actors_get_the_answers_meant_for_them(watchdog):
    """Actor threads with random delays and two server threads: each row's output is
    a function of that row's own input, checked for every request."""

    class Echo(torch.nn.Module):
        """logits = obs (so the answer identifies the request); baseline = reward."""

        def initial_state(self, batch_size):
            return ()

        def forward(self, inputs, core_state):
            obs = inputs["obs"].float()
            return AgentOutput(policy_logits=obs[..., :NUM_ACTIONS], baseline=inputs["reward"]), ()

    num_actors, num_envs, rounds = 6, 4, 300
    table = make_table(Echo(), num_actors, num_envs, num_servers=2)
    server = make_server(table, Echo(), Echo(), batch_window=0.0005)
    server.start()
    errors = []

    def actor(i: int) -> None:
        policy = CentralInference(table, i, lambda: True)
        rng = random.Random(i)
        try:
            for r in range(rounds):
                tag = float(i * 100_000 + r)
                obs = torch.full((num_envs, *OBS_SHAPE), tag) + torch.arange(num_envs)[:, None]
                inputs = {
                    "obs": obs,
                    "reward": torch.full((num_envs,), tag),
                    "done": torch.zeros(num_envs, dtype=torch.bool),
                    "last_action": torch.zeros(num_envs, dtype=torch.int64),
                }
                out = tensors(policy.act(inputs))
                if not torch.equal(out["policy_logits"], obs[:, :NUM_ACTIONS]):
                    errors.append((i, r, "logits"))
                if not torch.equal(out["baseline"], inputs["reward"]):
                    errors.append((i, r, "baseline"))
                if rng.random() < 0.1:
                    time.sleep(rng.uniform(0, 0.002))
        except Exception as error:  # reported below
            errors.append((i, repr(error)))

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(num_actors)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    table.close()
    server.stop()
    assert errors == []
    assert server.error is None
    stats = table.batcher.stats
    assert stats.posted == stats.answered == num_actors * num_envs * rounds
    assert server.stats.requests == num_actors * num_envs * rounds


def test_server_refreshes_weights_only_every_sync_every_updates(watchdog):
    source, own = recurrent_model(seed=0), recurrent_model(seed=1)
    updates = [0]
    table = make_table(source, 1, 2)
    server = make_server(table, own, source, sync_every=3, num_updates=lambda: updates[0])
    first = next(iter(source.parameters()))
    assert torch.equal(next(iter(own.parameters())), first)  # synced at construction
    with torch.no_grad():
        first.add_(1.0)
    updates[0] = 2
    server._sync()
    assert not torch.equal(next(iter(own.parameters())), first)  # 2 < 3 updates: stale
    updates[0] = 3
    server._sync()
    assert torch.equal(next(iter(own.parameters())), first)
    assert server.stats.syncs == 2


def test_a_failing_forward_pass_is_reported_not_hung(watchdog):
    class Broken(torch.nn.Module):
        def initial_state(self, batch_size):
            return ()

        def forward(self, inputs, core_state):
            raise RuntimeError("boom")

    table = make_table(Broken(), 1, 2)
    server = make_server(table, Broken(), Broken())
    server.start()
    policy = CentralInference(table, 0, lambda: True)
    inputs = random_inputs(torch.Generator().manual_seed(0), 2, 0)
    waiter = threading.Thread(target=lambda: pytest.raises(QueueClosed, policy.act, inputs))
    waiter.start()
    assert server.failed.wait(10)
    assert "boom" in str(server.error)
    table.close()  # shutdown wakes the actor left waiting
    waiter.join(10)
    assert not waiter.is_alive()
    server.stop()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_actor_exits_when_the_server_process_is_gone(forkserver, processes, watchdog):
    """No server answers and the learner pid is gone: the actor exits 0 on its own."""
    model = build_model("mlp", OBS_SHAPE, 2)
    policy = CategoricalPolicy(2)
    table = InferenceTable(
        num_actors=1, num_envs=2, obs=box_obs(OBS_SHAPE, np.float32), policy=policy
    )
    buffers = RolloutBuffers(
        rollout_spec(
            unroll_length=5,
            obs=box_obs(OBS_SHAPE, np.float32),
            record=policy.record_spec(),
            core_state_shapes=core_state_shapes(model.initial_state(1)),
        ),
        4,
    )
    board = torch.zeros((1, ERROR_BOARD_BYTES), dtype=torch.uint8).share_memory_()
    settings = ActorSettings(
        env="CartPole-v1", seed=0, num_actors=1, num_envs=2, episodic_life=False, policy=policy
    )
    actor = processes.start(
        forkserver, run_actor, 0, 0, settings, buffers, table, _dead_pid(), board, name="actor"
    )
    actor.join(15)
    assert actor.exitcode == 0, bytes(board[0].numpy()).rstrip(b"\0").decode()
    assert table.batcher.pending(0) == 2  # it had posted and was waiting


@pytest.mark.parametrize("policy", ["local", "central"])
def test_actors_exit_when_the_learner_dies_hard(tmp_path, policy):
    marker = uuid.uuid4().hex
    proc = start(
        [*CARTPOLE_SMALL, "--policy", policy, "--total_steps", "100000000"]
        + ["--savedir", str(tmp_path), "--xpid", "hard"],
        marker,
    )
    try:
        wait_for_rows(tmp_path / "hard" / "logs.csv", 2, proc)
        assert actor_pids(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)  # the learner (and its inference threads) only
        proc.communicate(timeout=10)
        assert wait_until_gone(marker, timeout=10) == []
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_central_run_survives_actors_killed_mid_request(tmp_path):
    """Actors SIGKILLed at random moments (most of an actor's time is spent posted or
    waiting): the server keeps serving the others and the replacements, the run ends
    normally, nothing torn reaches the learner, and nothing is left behind."""
    marker = uuid.uuid4().hex
    before = shm_entries()
    proc = start(
        [*CARTPOLE_SMALL, "--policy", "central", "--total_steps", "20000"]
        + ["--max_actor_restarts", "1000", "--savedir", str(tmp_path), "--xpid", "kills"],
        marker,
    )
    rng = random.Random(0)
    kills = 0
    try:
        wait_for_rows(tmp_path / "kills" / "logs.csv", 1, proc)
        while proc.poll() is None and kills < 10:
            time.sleep(rng.uniform(0.3, 1.0))
            pids = actor_pids(proc.pid)
            if pids:
                try:
                    os.kill(rng.choice(pids), signal.SIGKILL)
                    kills += 1
                except ProcessLookupError:
                    pass
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err
    assert kills >= 5, f"only {kills} kills happened"
    assert out.count("killed by SIGKILL") >= kills - 2
    assert "central inference: " in out and " envs on average" in out  # the run's summary
    rows = read_csv(tmp_path / "kills" / "logs.csv")
    assert int(rows[-1]["step"]) >= 20_000
    assert int(rows[-1]["torn_rollouts"]) == 0
    assert wait_until_gone(marker) == []
    assert shm_entries() - before == set()
