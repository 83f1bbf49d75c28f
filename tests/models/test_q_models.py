"""Contract tests for the Q-networks of beast.models (QNet, build_q_model).

The contract: the actor-critic models' inputs ([T, B] time-major, uint8 images scaled
inside), QOutput(q_values [T, B, A] float32) and a core state out; a dueling head, so
the mean of Q over actions is the value stream; with an LSTM, reward and last action
feed the core and `done` resets the state per sample (one call over T steps equals T
one-step calls); without one, only the observation matters, unless use_last_action_reward
feeds the head the reward and last action too.
"""

import pytest
import torch

from beast.models import QNet, QOutput, build_q_model

SMALL_CASES = [
    ("atari", (3, 36, 36), 5),
    ("resnet", (3, 36, 36), 5),
    ("mlp", (7,), 3),
]


@pytest.fixture(autouse=True, scope="module")
def single_intra_op_thread():
    """Small models on shared cores: one intra-op thread (see tests/models/test_models.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs(obs_shape, num_actions, T, B, *, generator, done=None):
    if len(obs_shape) == 3:
        obs = torch.randint(0, 256, (T, B, *obs_shape), dtype=torch.uint8, generator=generator)
    else:
        obs = torch.randn((T, B, *obs_shape), generator=generator)
    return {
        "obs": obs,
        "reward": 3 * torch.randn(T, B, generator=generator),
        "last_action": torch.randint(0, num_actions, (T, B), generator=generator),
        "done": torch.zeros(T, B, dtype=torch.bool) if done is None else done,
    }


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_shapes_dtypes_and_state(name, obs_shape, num_actions, use_lstm):
    T, B = 4, 3
    model = build_q_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    assert isinstance(model, QNet)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out, state = model(make_inputs(obs_shape, num_actions, T, B, generator=g))
    assert isinstance(out, QOutput)
    assert out.q_values.shape == (T, B, num_actions) and out.q_values.dtype == torch.float32
    if use_lstm:
        width = 64 if name == "mlp" else 512  # MLP default, R2D2's LSTM
        assert [s.shape for s in state] == [(1, B, width)] * 2
        assert [s.shape for s in model.initial_state(B)] == [(1, B, width)] * 2
    else:
        assert state == () and model.initial_state(B) == ()


@pytest.mark.parametrize("use_lstm", [False, True])
def test_dueling_mean_over_actions_is_the_value_stream(use_lstm):
    model = build_q_model("mlp", (5,), 4, use_lstm=use_lstm, hidden_size=16)
    values = []
    model.value[-1].register_forward_hook(lambda module, args, out: values.append(out))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        out, _ = model(make_inputs((5,), 4, 3, 2, generator=g))
    torch.testing.assert_close(out.q_values.mean(-1), values[0].view(3, 2))


def test_feedforward_reads_only_the_observation():
    model = build_q_model("mlp", (5,), 4)
    g = torch.Generator().manual_seed(0)
    inputs = make_inputs((5,), 4, 3, 2, generator=g)
    other = make_inputs((5,), 4, 3, 2, generator=g, done=torch.ones(3, 2, dtype=torch.bool))
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(dict(other, obs=inputs["obs"]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("use_lstm", [False, True])
def test_feedforward_reads_only_the_observation_unless_asked(use_lstm):
    model = build_q_model(
        "mlp", (5,), 4, use_lstm=use_lstm, use_last_action_reward=None if use_lstm else True
    )
    g = torch.Generator().manual_seed(0)
    inputs = make_inputs((5,), 4, 3, 2, generator=g)
    other = dict(inputs, reward=-inputs["reward"], last_action=(inputs["last_action"] + 1) % 4)
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(other)
    assert not torch.allclose(a.q_values, b.q_values)
    if not use_lstm:
        assert model.value[0].in_features == 64 + 1 + 4


@pytest.mark.parametrize("key", ["reward", "last_action"])
def test_lstm_core_reads_reward_and_last_action(key):
    torch.manual_seed(0)
    model = build_q_model("mlp", (5,), 4, use_lstm=True)
    g = torch.Generator().manual_seed(0)
    inputs = make_inputs((5,), 4, 3, 2, generator=g)
    changed = dict(inputs)
    changed[key] = inputs[key] * 0.5 if key == "reward" else (inputs[key] + 1) % 4
    with torch.no_grad():
        a, _ = model(inputs)
        b, _ = model(changed)
    assert not torch.allclose(a.q_values, b.q_values)


@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_lstm_unroll_matches_stepping_with_resets(name, obs_shape, num_actions):
    T, B = 6, 3
    g = torch.Generator().manual_seed(0)
    done = torch.rand(T, B, generator=g) < 0.3
    torch.manual_seed(0)
    model = build_q_model(name, obs_shape, num_actions, use_lstm=True, hidden_size=32)
    inputs = make_inputs(obs_shape, num_actions, T, B, generator=g, done=done)
    state = tuple(torch.randn(s.shape, generator=g) for s in model.initial_state(B))
    with torch.no_grad():
        out, final = model(inputs, state)
        stepped, step_state = [], state
        for t in range(T):
            step_out, step_state = model({k: v[t : t + 1] for k, v in inputs.items()}, step_state)
            stepped.append(step_out.q_values)
    # Same math grouped differently (one LSTM call per chunk vs per step): float32 ulps.
    torch.testing.assert_close(out.q_values, torch.cat(stepped), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, step_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_gradients_reach_every_parameter(name, obs_shape, num_actions, use_lstm):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = build_q_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    out, _ = model(make_inputs(obs_shape, num_actions, 3, 2, generator=g))
    (out.q_values * torch.randn(out.q_values.shape, generator=g)).sum().backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, param_name


def test_builder_picks_and_rejects():
    assert build_q_model("auto", (4, 84, 84), 6).torso[0][0].kernel_size == (8, 8)
    assert isinstance(build_q_model("auto", (4,), 2).torso[1], torch.nn.Linear)
    assert build_q_model("atari", (4, 84, 84), 6).value[0].out_features == 512
    assert build_q_model("mlp", (4,), 2, hidden_size=32).value[0].in_features == 32
    for args, kwargs in [
        (("nope", (4,), 2), {}),
        (("auto", (2, 3), 2), {}),
        (("mlp", (4,), 0), {}),
        (("mlp", (4,), 2), {"hidden_size": 0}),
        (("atari", (4,), 2), {}),
        (("atari", (4, 84, 84), 6), {"hidden_size": 128}),  # no LSTM to size
    ]:
        with pytest.raises(ValueError):
            build_q_model(*args, **kwargs)
