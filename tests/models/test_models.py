"""Contract tests for beast.models.

The contract: time-major [T, B] inputs in, AgentOutput(policy_logits [T, B, A] float32,
baseline [T, B] float32) and a core state out; uint8 images scaled inside the model; reward
clipped and last action one-hot encoded as core inputs of the image models and the LSTMs (a
feed-forward MLP reads the observation alone), as use_last_action_reward says where it is
given; a recurrent state reset per sample on
`done` before step t, so one call over T steps equals T one-step calls carrying the state;
state_dicts portable between models built with the same arguments, in shared memory.
"""

import re

import pytest
import torch

from beast.models import (
    MODEL_NAMES,
    ActorCriticNet,
    AgentOutput,
    AtariNet,
    MLPNet,
    ResNet,
    build_model,
)

PONG = ((4, 84, 84), 6)
CARTPOLE = ((4,), 2)
# Small images keep the many-step tests fast; 36x36 is the smallest the atari torso takes.
SMALL_IMAGE = (3, 36, 36)

# (name, obs_shape, num_actions) for one small-ish config of every concrete model.
MODEL_CASES = [
    ("atari", *PONG),
    ("resnet", *PONG),
    ("mlp", *CARTPOLE),
]
SMALL_CASES = [
    ("atari", SMALL_IMAGE, 5),
    ("resnet", SMALL_IMAGE, 5),
    ("mlp", (7,), 3),
]


@pytest.fixture(autouse=True, scope="module")
def single_intra_op_thread():
    """These models are small and the cores are shared: with another process busy, OpenMP
    threads spin at barriers and a 2-thread forward ran 10-50x slower than a 1-thread one."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def make_inputs(obs_shape, num_actions, T, B, *, generator, done=None):
    """Random inputs; uint8 obs for images (3-D), float32 for vectors."""
    if len(obs_shape) == 3:
        obs = torch.randint(0, 256, (T, B, *obs_shape), dtype=torch.uint8, generator=generator)
    else:
        obs = torch.randn((T, B, *obs_shape), generator=generator)
    if done is None:
        done = torch.zeros(T, B, dtype=torch.bool)
    return {
        "obs": obs,
        # Scale 3 so some rewards fall outside [-1, 1] and exercise the clip.
        "reward": 3 * torch.randn(T, B, generator=generator),
        "last_action": torch.randint(0, num_actions, (T, B), generator=generator),
        "done": done,
    }


def random_state(model, B, generator):
    return tuple(torch.randn(s.shape, generator=generator) for s in model.initial_state(B))


def step(inputs, t):
    """The inputs of step t alone, keeping a T axis of 1."""
    return {k: v[t : t + 1] for k, v in inputs.items()}


@pytest.mark.parametrize("T,B", [(1, 1), (1, 5), (4, 1), (4, 3)])
@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("name,obs_shape,num_actions", MODEL_CASES + SMALL_CASES)
def test_output_shapes_and_dtypes(name, obs_shape, num_actions, use_lstm, T, B):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    model = build_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    assert isinstance(model, ActorCriticNet)
    assert model.num_actions == num_actions
    inputs = make_inputs(obs_shape, num_actions, T, B, generator=g)
    with torch.no_grad():
        out, state = model(inputs, model.initial_state(B))
    assert isinstance(out, AgentOutput)
    assert out.policy_logits.shape == (T, B, num_actions)
    assert out.policy_logits.dtype == torch.float32
    assert out.baseline.shape == (T, B)
    assert out.baseline.dtype == torch.float32
    assert torch.isfinite(out.policy_logits).all() and torch.isfinite(out.baseline).all()
    if use_lstm:
        assert len(state) == 2
        for s, s0 in zip(state, model.initial_state(B), strict=True):
            assert s.shape == s0.shape and s.dtype == torch.float32
    else:
        assert state == ()


@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_initial_state(name, obs_shape, num_actions):
    assert build_model(name, obs_shape, num_actions).initial_state(3) == ()
    model = build_model(name, obs_shape, num_actions, use_lstm=True, hidden_size=24)
    for device in (None, "cpu", torch.device("cpu")):
        h, c = model.initial_state(3, device)
        for s in (h, c):
            assert s.shape == (1, 3, 24) and s.dtype == torch.float32
            assert s.device.type == "cpu"
            assert not s.any()


@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_empty_state_means_initial_state(name, obs_shape, num_actions):
    model = build_model(name, obs_shape, num_actions, use_lstm=True)
    inputs = make_inputs(obs_shape, num_actions, 3, 2, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        out_a, state_a = model(inputs)
        out_b, state_b = model(inputs, model.initial_state(2))
    # Same ops on the same values: exact.
    torch.testing.assert_close(out_a, out_b, rtol=0, atol=0)
    torch.testing.assert_close(state_a, state_b, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["atari", "resnet", "mlp"])
def test_uint8_obs_scaled_inside_model(name):
    obs_shape = SMALL_IMAGE
    model = build_model(name, obs_shape, 4)
    inputs = make_inputs(obs_shape, 4, 2, 3, generator=torch.Generator().manual_seed(0))
    obs_before = inputs["obs"].clone()
    as_float = dict(inputs, obs=inputs["obs"].float() / 255)
    with torch.no_grad():
        out_uint8, _ = model(inputs)
        out_float, _ = model(as_float)
    # The model does the same float conversion and division as this test: exact.
    torch.testing.assert_close(out_uint8, out_float, rtol=0, atol=0)
    assert torch.equal(inputs["obs"], obs_before)  # caller's uint8 tensor left alone


def test_float_obs_not_modified():
    model = build_model("mlp", (5,), 3)
    inputs = make_inputs((5,), 3, 2, 2, generator=torch.Generator().manual_seed(0))
    obs_before = inputs["obs"].clone()
    model(inputs)
    assert torch.equal(inputs["obs"], obs_before)


@pytest.mark.parametrize("use_lstm, use_last_action_reward", [(True, None), (False, True)])
def test_reward_clipped_and_last_action_used(use_lstm, use_last_action_reward):
    model = build_model(
        "mlp", (5,), 3, use_lstm=use_lstm, use_last_action_reward=use_last_action_reward
    )
    inputs = make_inputs((5,), 3, 1, 4, generator=torch.Generator().manual_seed(0))

    def run(**overrides):
        with torch.no_grad():
            return model(dict(inputs, **overrides))[0]

    big, one = torch.full((1, 4), 7.0), torch.ones(1, 4)
    # Clipping maps both to exactly 1.0: exact.
    torch.testing.assert_close(run(reward=big), run(reward=one), rtol=0, atol=0)
    torch.testing.assert_close(run(reward=-big), run(reward=-one), rtol=0, atol=0)
    assert not torch.allclose(run(reward=one).baseline, run(reward=0.5 * one).baseline)
    a0, a1 = torch.zeros(1, 4, dtype=torch.long), torch.ones(1, 4, dtype=torch.long)
    assert not torch.allclose(run(last_action=a0).baseline, run(last_action=a1).baseline)


@pytest.mark.parametrize(
    "name, obs_shape, kwargs, reads",
    [
        ("mlp", (5,), {}, False),  # a feed-forward MLP acts on the observation alone
        ("mlp", (5,), {"use_lstm": True}, True),
        ("mlp", (5,), {"use_lstm": True, "use_last_action_reward": False}, False),
        ("separate_mlp", (5,), {}, False),
        ("atari", SMALL_IMAGE, {}, True),  # one frame stack shows neither (TorchBeast's)
        ("resnet", SMALL_IMAGE, {}, True),
        ("atari", SMALL_IMAGE, {"use_last_action_reward": False}, False),
    ],
)
def test_which_networks_read_the_last_action_and_reward(name, obs_shape, kwargs, reads):
    torch.manual_seed(0)
    model = build_model(name, obs_shape, 3, **kwargs)
    inputs = make_inputs(obs_shape, 3, 2, 4, generator=torch.Generator().manual_seed(0))
    other = dict(inputs, reward=-inputs["reward"], last_action=(inputs["last_action"] + 1) % 3)
    with torch.no_grad():
        a, b = model(inputs)[0], model(other)[0]
    assert a.baseline.shape == (2, 4)
    if reads:
        assert not torch.allclose(a.baseline, b.baseline)
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # The trunk's size follows: what the core reads is F (+ 1 + A).
    if name == "mlp" and not kwargs.get("use_lstm"):
        assert model.baseline.in_features == 64


def test_separate_mlp_refuses_the_last_action_and_reward():
    with pytest.raises(ValueError, match="separate_mlp model reads the observation alone"):
        build_model("separate_mlp", (5,), 3, use_last_action_reward=True)


def test_auto_picks_by_obs_rank():
    assert isinstance(build_model("auto", *PONG), AtariNet)
    assert isinstance(build_model("auto", *CARTPOLE), MLPNet)
    assert isinstance(build_model("resnet", *PONG), ResNet)
    assert set(MODEL_NAMES) == {"auto", "atari", "resnet", "mlp", "separate_mlp"}


def test_mlp_flattens_images():
    model = build_model("mlp", (2, 5, 5), 3)
    inputs = make_inputs((2, 5, 5), 3, 2, 2, generator=torch.Generator().manual_seed(0))
    assert model(inputs)[0].policy_logits.shape == (2, 2, 3)


def test_hidden_size():
    mlp = build_model("mlp", (4,), 2, hidden_size=32)
    assert mlp.torso[1].out_features == 32 and mlp.torso[3].out_features == 32
    mlp_lstm = build_model("mlp", (4,), 2, use_lstm=True, hidden_size=32)
    assert mlp_lstm.initial_state(1)[0].shape == (1, 1, 32)
    atari_lstm = build_model("atari", *PONG, use_lstm=True, hidden_size=128)
    assert atari_lstm.initial_state(1)[0].shape == (1, 1, 128)
    assert build_model("resnet", *PONG, use_lstm=True).initial_state(1)[0].shape == (1, 1, 256)


@pytest.mark.parametrize(
    "name,obs_shape,num_actions,kwargs",
    [
        ("atari", (4,), 2, {}),  # image model on vectors
        ("resnet", (4,), 2, {}),
        ("atari", (84, 84), 2, {}),
        ("atari", (4, 10, 10), 2, {}),  # too small for the 8x8/4 + 4x4/2 + 3x3 convs
        ("auto", (4, 10, 10), 2, {}),
        ("auto", (84, 84), 2, {}),  # neither a vector nor [C, H, W]
        ("auto", (1, 2, 3, 4), 2, {}),
        ("lstm", (4,), 2, {}),  # unknown name
        ("mlp", (), 2, {}),
        ("mlp", (0,), 2, {}),
        ("mlp", (4,), 0, {}),
        ("mlp", (4,), 2, {"hidden_size": 0}),
        ("atari", (4, 84, 84), 6, {"hidden_size": 128}),  # would be ignored without an LSTM
    ],
)
def test_build_model_rejects(name, obs_shape, num_actions, kwargs):
    with pytest.raises(ValueError) as info:
        build_model(name, obs_shape, num_actions, **kwargs)
    assert "\n" not in str(info.value)


def _reference_unroll(model, inputs, state):
    """T one-step calls carrying the state; the reset on done is done here, by the caller,
    so it checks the model's own reset rather than reusing it."""
    T, B = inputs["done"].shape
    outputs = []
    for t in range(T):
        done = inputs["done"][t].view(1, B, 1)
        state = tuple(torch.where(done, torch.zeros_like(s), s) for s in state)
        step_inputs = dict(step(inputs, t), done=torch.zeros(1, B, dtype=torch.bool))
        out, state = model(step_inputs, state)
        outputs.append(out)
    stacked = AgentOutput(*(torch.cat(x) for x in zip(*outputs, strict=True)))
    return stacked, state


@pytest.mark.parametrize("done_pattern", ["random", "none", "all", "first_step"])
@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_lstm_unroll_matches_stepping(name, obs_shape, num_actions, done_pattern):
    T, B = 10, 4
    g = torch.Generator().manual_seed(0)
    done = {
        "random": torch.rand(T, B, generator=g) < 0.25,
        "none": torch.zeros(T, B, dtype=torch.bool),
        "all": torch.ones(T, B, dtype=torch.bool),
        "first_step": torch.arange(T).view(T, 1).expand(T, B) == 0,
    }[done_pattern]
    torch.manual_seed(0)
    model = build_model(name, obs_shape, num_actions, use_lstm=True)
    inputs = make_inputs(obs_shape, num_actions, T, B, generator=g, done=done)
    state = random_state(model, B, g)
    with torch.no_grad():
        out, final_state = model(inputs, state)
        ref_out, ref_state = _reference_unroll(model, inputs, state)
    # Same math in a different grouping: one LSTM call over a chunk batches the input
    # projection of all its steps into one GEMM, stepping does one GEMM per step, so float32
    # rounding may differ by a few ulps per step.
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final_state, ref_state, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_done_resets_state_per_sample(name, obs_shape, num_actions):
    T, B = 3, 2
    g = torch.Generator().manual_seed(0)
    done = torch.zeros(T, B, dtype=torch.bool)
    done[0, 0] = True  # sample 0 starts an episode at t=0; sample 1 continues
    model = build_model(name, obs_shape, num_actions, use_lstm=True)
    inputs = make_inputs(obs_shape, num_actions, T, B, generator=g, done=done)
    state_a = random_state(model, B, g)
    state_b = random_state(model, B, g)
    # NaN in the incoming state: a reset must clear it, not multiply it by zero.
    state_nan = tuple(torch.full_like(s, float("nan")) for s in state_a)
    with torch.no_grad():
        out_a, _ = model(inputs, state_a)
        out_b, _ = model(inputs, state_b)
        out_nan, _ = model(inputs, state_nan)
    for x_a, x_b, x_nan in zip(out_a, out_b, out_nan, strict=True):
        # The reset sample saw zeros either way: exact.
        torch.testing.assert_close(x_a[:, 0], x_b[:, 0], rtol=0, atol=0)
        torch.testing.assert_close(x_a[:, 0], x_nan[:, 0], rtol=0, atol=0)
        assert not torch.allclose(x_a[:, 1], x_b[:, 1])
        assert torch.isnan(x_nan[:, 1]).all()


@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_feedforward_ignores_done_and_returns_empty_state(name, obs_shape, num_actions):
    model = build_model(name, obs_shape, num_actions)
    g = torch.Generator().manual_seed(0)
    inputs = make_inputs(obs_shape, num_actions, 3, 2, generator=g)
    with torch.no_grad():
        out, state = model(inputs)
        out_done, _ = model(dict(inputs, done=torch.ones(3, 2, dtype=torch.bool)))
    assert state == ()
    torch.testing.assert_close(out, out_done, rtol=0, atol=0)  # same ops: exact


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_gradients_reach_every_parameter(name, obs_shape, num_actions, use_lstm):
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    T, B = 3, 2  # T > 1 so the LSTM's hidden-to-hidden weights get a nonzero gradient
    model = build_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    out, _ = model(make_inputs(obs_shape, num_actions, T, B, generator=g))
    # Random weights so no symmetry (e.g. softmax-invariant sums) zeroes a gradient.
    loss = (out.policy_logits * torch.randn(out.policy_logits.shape, generator=g)).sum()
    loss = loss + (out.baseline * torch.randn(out.baseline.shape, generator=g)).sum()
    loss.backward()
    for param_name, param in model.named_parameters():
        assert param.grad is not None, param_name
        assert param.grad.abs().sum() > 0, param_name
        assert torch.isfinite(param.grad).all(), param_name


@pytest.mark.parametrize("use_lstm", [False, True])
@pytest.mark.parametrize("name,obs_shape,num_actions", SMALL_CASES)
def test_state_dict_loads_into_shared_memory_copy(name, obs_shape, num_actions, use_lstm):
    torch.manual_seed(0)
    learner_model = build_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    torch.manual_seed(1)  # different initial weights
    actor_model = build_model(name, obs_shape, num_actions, use_lstm=use_lstm)
    actor_model.share_memory()
    actor_model.load_state_dict(learner_model.state_dict())
    # load_state_dict copies in place, so the published weights stay in shared memory.
    for param_name, param in actor_model.state_dict().items():
        assert param.is_shared(), param_name
    inputs = make_inputs(obs_shape, num_actions, 2, 3, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        expected = learner_model(inputs)
        actual = actor_model(inputs)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)  # same weights, same ops


def _conv(c_in, c_out, k):
    return c_in * c_out * k * k + c_out


def _linear(n_in, n_out):
    return n_in * n_out + n_out


def _lstm(n_in, hidden):
    return 4 * hidden * (n_in + hidden) + 8 * hidden  # two bias vectors


def n_params(model):
    return sum(p.numel() for p in model.parameters())


def test_parameter_counts_match_the_architectures():
    """Counts worked out by hand from the layer specs in the docstrings."""
    A = 6
    atari_torso = (
        _conv(4, 32, 8) + _conv(32, 64, 4) + _conv(64, 64, 3) + _linear(64 * 7 * 7, 512)
    )  # 84 -> 20 -> 9 -> 7
    core_in = 512 + A + 1
    assert n_params(build_model("atari", (4, 84, 84), A)) == (
        atari_torso + _linear(core_in, A) + _linear(core_in, 1)
    )
    assert n_params(build_model("atari", (4, 84, 84), A, use_lstm=True)) == (
        atari_torso + _lstm(core_in, 256) + _linear(256, A) + _linear(256, 1)
    )
    resnet_torso = sum(
        _conv(c_in, c, 3) + 4 * _conv(c, c, 3) for c_in, c in [(4, 16), (16, 32), (32, 32)]
    ) + _linear(32 * 11 * 11, 256)  # 84 -> 42 -> 21 -> 11
    core_in = 256 + A + 1
    assert n_params(build_model("resnet", (4, 84, 84), A)) == (
        resnet_torso + _linear(core_in, A) + _linear(core_in, 1)
    )
    mlp_torso = _linear(4, 64) + _linear(64, 64)
    assert n_params(build_model("mlp", (4,), 2)) == (
        mlp_torso + _linear(64, 2) + _linear(64, 1)
    )  # feed-forward: the heads read the torso's features alone
    core_in = 64 + 2 + 1
    assert n_params(build_model("mlp", (4,), 2, use_lstm=True)) == (
        mlp_torso + _lstm(core_in, 64) + _linear(64, 2) + _linear(64, 1)
    )


# --- Dict and Tuple observations: the multi-input torso -------------------------------

# DictCartPole-v1's leaves, and a Tuple holding an image and a Dict of a vector and a scalar.
DICT_CARTPOLE = {"position": (2,), "velocity": (2,)}
NESTED = ((1, 16, 16), {"arm": (3,), "grip": ()})


def nested_inputs(T, B, num_actions, generator):
    """Random inputs for NESTED: the observation a tuple of (uint8 image, dict)."""
    inputs = make_inputs((3,), num_actions, T, B, generator=generator)
    inputs["obs"] = (
        torch.randint(0, 256, (T, B, 1, 16, 16), dtype=torch.uint8, generator=generator),
        {"arm": torch.randn(T, B, 3, generator=generator), "grip": torch.rand(T, B)},
    )
    return inputs


def test_the_multi_input_model_on_split_vectors_is_the_mlp_on_the_whole():
    """An independent reference: DictCartPole's MLP on [x, theta, x_dot, theta_dot] (its
    leaves concatenated in field order) is CartPole's MLPNet on [x, x_dot, theta,
    theta_dot] with the first layer's columns permuted to match."""
    generator = torch.Generator().manual_seed(0)
    split = build_model("auto", DICT_CARTPOLE, 2, use_lstm=True)
    whole = build_model("auto", (4,), 2, use_lstm=True)
    state = split.state_dict()
    # torso.vector_torso.1 is the first Linear (after a Flatten) of the vector MLP.
    first = state.pop("torso.vector_torso.1.weight")
    bias = state.pop("torso.vector_torso.1.bias")
    rest = {key.replace("torso.vector_torso.", "torso."): value for key, value in state.items()}
    order = [0, 2, 1, 3]  # split column j holds CartPole's element order[j]
    permuted = torch.empty_like(first)
    permuted[:, order] = first
    whole.load_state_dict({**rest, "torso.1.weight": permuted, "torso.1.bias": bias})
    inputs = make_inputs((4,), 2, 5, 3, generator=generator)
    x = inputs["obs"]
    split_inputs = {**inputs, "obs": {"position": x[..., [0, 2]], "velocity": x[..., [1, 3]]}}
    with torch.no_grad():
        (want, _), (got, _) = whole(inputs), split(split_inputs)
    torch.testing.assert_close(got.policy_logits, want.policy_logits)
    torch.testing.assert_close(got.baseline, want.baseline)


def test_the_multi_input_torso_concatenates_images_then_vectors():
    """Features = [conv torso of the image (scaled by 1/255), MLP of [arm, grip]]."""
    from beast.models import MultiInputTorso

    generator = torch.Generator().manual_seed(1)
    torso = MultiInputTorso(NESTED, hidden_size=8)
    assert torso.image_keys == ["obs[0]"] and torso.vector_keys == ["obs[1].arm", "obs[1].grip"]
    image = torch.randint(0, 256, (6, 1, 16, 16), dtype=torch.uint8, generator=generator)
    arm, grip = torch.randn(6, 3, generator=generator), torch.rand(6)
    with torch.no_grad():
        got = torso((image.float() / 255, {"arm": arm, "grip": grip}))
        conv = torso.image_torsos[0](image.float() / 255)  # the IMPALA ResNet's, 16x16 < 36
        vector = torso.vector_torso(torch.cat([arm, grip[:, None]], dim=1))
    assert conv.shape == (6, 256) and torso.size == 256 + 8
    torch.testing.assert_close(got, torch.cat([conv, vector], dim=1))


@pytest.mark.parametrize(
    "name, use_lstm",
    # separate_mlp is feed-forward: no LSTM case.
    [("auto", False), ("auto", True), ("mlp", False), ("mlp", True), ("separate_mlp", False)],
)
def test_nested_observations_run_and_train_every_parameter(name, use_lstm):
    generator = torch.Generator().manual_seed(2)
    model = build_model(name, NESTED, 3, use_lstm=use_lstm)
    inputs = nested_inputs(4, 2, 3, generator)
    output, _ = model(inputs, model.initial_state(2))
    assert output.policy_logits.shape == (4, 2, 3) and output.baseline.shape == (4, 2)
    (output.policy_logits.sum() + output.baseline.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


def test_the_gaussian_head_takes_nested_observations():
    generator = torch.Generator().manual_seed(5)
    model = build_model("separate_mlp", NESTED, 0, action_dim=2)
    inputs = nested_inputs(3, 2, 1, generator)
    inputs["last_action"] = torch.randn(3, 2, 2, generator=generator)
    output, _ = model(inputs)
    assert output.action_mean.shape == output.action_log_std.shape == (3, 2, 2)


def test_q_networks_take_nested_observations():
    from beast.models import build_q_model

    generator = torch.Generator().manual_seed(3)
    model = build_q_model("auto", NESTED, 3, use_lstm=True, num_atoms=5)
    output, state = model(nested_inputs(4, 2, 3, generator), model.initial_state(2))
    assert output.q_logits.shape == (4, 2, 3, 5) and len(state) == 2


@pytest.mark.parametrize(
    "name, obs_shape, fragment",
    [
        ("auto", {"grid": (5, 5)}, "observation leaf obs.grid has shape (5, 5)"),
        ("auto", ((2,), (1, 2, 3, 4)), "observation leaf obs[1] has shape (1, 2, 3, 4)"),
        ("atari", DICT_CARTPOLE, "the atari model reads one image observation"),
        ("resnet", NESTED, "the resnet model reads one image observation"),
    ],
)
def test_nested_observations_the_built_in_models_cannot_encode(name, obs_shape, fragment):
    with pytest.raises(ValueError, match=re.escape(fragment)):
        build_model(name, obs_shape, 2)


def test_sac_networks_encode_leaves_and_keep_box_checkpoints():
    from beast.algos.qpg.networks import ActorCriticQNet

    # A vector Box: the torsos have no parameters, so a checkpoint's keys are as before.
    box = ActorCriticQNet((3,), 1, hidden_sizes=(8,))
    assert not any("torso" in key for key in box.state_dict())
    nested = ActorCriticQNet(NESTED, 2, hidden_sizes=(8,))
    generator = torch.Generator().manual_seed(4)
    inputs = nested_inputs(1, 5, 2, generator)
    outputs, _ = nested(inputs)
    assert outputs["action_mean"].shape == (1, 5, 2)
    assert nested.critic(inputs, torch.zeros(1, 5, 2)).shape == (2, 1, 5)
    # The actor and the critics each have their own conv torso for the image.
    assert nested.actor_torso.image_keys == nested.critic.torso.image_keys == ["obs[0]"]
