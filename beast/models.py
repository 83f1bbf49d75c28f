"""Actor-critic networks for IMPALA-style agents, and dueling Q-networks for R2D2 / Ape-X.

Every model is ``torso -> core -> heads`` and runs on time-major batches:

    inputs["obs"]          [T, B, *obs_shape]  uint8 images (scaled by 1/255 inside the
                                               model, so uint8 travels end to end), or
                                               float32 vectors (used as they are); for a
                                               Dict or Tuple observation, a dict (tuple)
                                               of such tensors, one per leaf, nested as
                                               the space is
    inputs["reward"]       [T, B] float32      raw reward that arrived with obs_t; the model
                                               clips it to [-1, 1] for the core input
    inputs["last_action"]  [T, B] int64        action taken before obs_t (one-hot encoded);
                           [T, B, d] float32   for continuous actions, used as it is
    inputs["done"]         [T, B] bool         obs_t starts a new episode; read only by
                                               recurrent models, which zero their state for
                                               that sample *before* processing step t

    AgentOutput.policy_logits  [T, B, num_actions] float32 (unnormalised; the caller samples)
    AgentOutput.baseline       [T, B] float32

Continuous (Box) actions of dimension d replace the logits by a diagonal Gaussian
(`GaussianAgentOutput`): ``action_mean`` [T, B, d] from a linear head, and
``action_log_std`` [T, B, d], a learned vector that does not depend on the state
(``--log_std_init``), as in PPO's MuJoCo setup (Schulman et al. 2017, section 6.1).

The core input is ``[torso features, clipped reward, one-hot last action]`` as in TorchBeast's
AtariNet. Without an LSTM the heads read that vector directly; with one, they read the LSTM
output. The policy and baseline heads are separate linear layers on a shared torso and core.

Recurrent state (``CoreState``) is ``(h, c)``, each float32 ``[1, B, lstm_size]``: one LSTM
layer of 256 units by default, as in the IMPALA paper (Espeholt et al. 2018, fig. 3), rather
than TorchBeast's two layers of ``fc + num_actions + 1`` units, which would add about 4.3M
parameters to AtariNet's 1.7M (a 256-unit layer adds 0.8M). Feed-forward models use the empty
state ``()``.

Initialisation: orthogonal weights and zero biases for every conv and linear layer (gain
sqrt(2), for the ReLUs that follow them), the policy head with gain 0.01 so the initial policy is
close to uniform (Andrychowicz et al. 2021, "What Matters in On-Policy RL?") and
the baseline head with gain 1. The LSTM keeps PyTorch's default uniform initialisation.

Dict and Tuple observations get the multi-input torso (`MultiInputTorso`, in place of the
MLP torso of "auto", "mlp" and "separate_mlp"): a conv torso per image leaf ([C, H, W]:
AtariNet's from 36x36 up, else the IMPALA ResNet's), one MLP on the concatenated vector
leaves, and their features concatenated; the core and heads are the same.

`SeparateMLPNet` ("separate_mlp") is Stable-Baselines3's and CleanRL's on-policy network:
two MLPs on the observation alone, one for the policy and one for the value, with no
shared layers and no reward or last-action input.

Q-networks (`QNet`, `build_q_model`) take the same inputs and torsos and return
``QOutput.q_values`` [T, B, num_actions] float32 through a dueling head (Wang et al. 2016). With
an LSTM (R2D2) the core input is the same ``[features, clipped reward, one-hot last action]``;
without one (Ape-X) the head reads the torso features alone, as in the Ape-X paper's dueling DQN.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from beast.fields import flatten_obs, map_inputs, model_inputs, obs_leaf, obs_path
from beast.references import import_module

__all__ = [
    "MODEL_NAMES",
    "ActorCriticNet",
    "AgentOutput",
    "AtariNet",
    "CoreState",
    "DistributionalQOutput",
    "QNet",
    "GaussianAgentOutput",
    "MLPNet",
    "SeparateMLPNet",
    "QOutput",
    "ModelError",
    "MultiInputTorso",
    "ObsShape",
    "ResNet",
    "build_model",
    "build_q_model",
    "build_user_model",
    "check_model",
    "WeightCopier",
    "copy_weights",
    "float_obs",
    "time_and_batch",
    "PolyakAverager",
    "polyak_update",
    "is_user_model",
]

MODEL_NAMES = ("auto", "atari", "resnet", "mlp", "separate_mlp")
# Hidden-layer activations of the MLP torsos (--activation).
ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "tanh": nn.Tanh}
# One observation's shape (a Box), or a Dict's or Tuple's leaves' shapes nested as the
# observation is (`EnvSpec.model_obs_shape`): what models are built from.
ObsShape = Sequence[Any] | Mapping[str, Any]
# The smallest image side AtariNet's torso takes (8x8 s4, 4x4 s2, 3x3 s1 convolutions).
ATARI_MIN_SIZE = 36

# Width of the LSTM core of the image models, as in the IMPALA paper (fig. 3).
DEFAULT_LSTM_SIZE = 256
# Width of both hidden layers of MLPNet (and of its LSTM): CleanRL's and Stable-Baselines3's
# default for classic control.
DEFAULT_MLP_HIDDEN_SIZE = 64
# Orthogonal-init gains; the ReLU gain is torch.nn.init.calculate_gain("relu").
_RELU_GAIN = math.sqrt(2.0)
_POLICY_GAIN = 0.01
_BASELINE_GAIN = 1.0


class AgentOutput(NamedTuple):
    """What a model returns for each step.

    policy_logits: float32 [T, B, num_actions], unnormalised log-probabilities.
    baseline: float32 [T, B], the value estimate V(x_t).
    """

    policy_logits: Tensor
    baseline: Tensor


class GaussianAgentOutput(NamedTuple):
    """What a model returns for each step with continuous actions of dimension d.

    action_mean: float32 [T, B, d], the Gaussian's mean (unbounded: env batches clip
        the drawn action to the action space's bounds).
    action_log_std: float32 [T, B, d], log standard deviations.
    baseline: float32 [T, B], the value estimate V(x_t).
    """

    action_mean: Tensor
    action_log_std: Tensor
    baseline: Tensor


CoreState = tuple[Tensor, ...]
"""``()`` for feed-forward models; ``(h, c)``, each float32 [1, B, lstm_size], for the LSTM."""


def _orthogonal_init(module: nn.Module, gain: float) -> None:
    """Orthogonal weights with ``gain`` and zero biases for every conv/linear in ``module``."""
    for layer in module.modules():
        if isinstance(layer, nn.Conv2d | nn.Linear):
            nn.init.orthogonal_(layer.weight, gain)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)


def _flat_size(module: nn.Module, in_shape: tuple[int, ...], model_name: str) -> int:
    """Features per sample that ``module`` outputs for one input of ``in_shape``.

    Found by a dummy pass so the models work for any [C, H, W]; a conv stack that would shrink
    the image below 1x1 becomes a one-line ValueError instead of a PyTorch shape error.
    """
    try:
        with torch.no_grad():
            out = module(torch.zeros(1, *in_shape))
    except RuntimeError:
        raise ValueError(
            f"obs_shape {in_shape} is too small for the {model_name} conv torso; "
            "use 'resnet' or 'mlp' for small images"
        ) from None
    return out[0].numel()


def _check_image_shape(obs_shape: tuple[int, ...], model_name: str) -> None:
    if len(obs_shape) != 3:
        raise ValueError(
            f"the {model_name} model needs image observations [C, H, W], got obs_shape "
            f"{obs_shape}; use 'mlp' for vectors"
        )


class _PolicyHeads(nn.Module):
    """The policy and baseline heads on a feature vector, for discrete or continuous actions.

    Discrete: ``policy`` is a linear layer to the logits. Continuous: ``policy`` gives the
    Gaussian's mean and ``log_std`` is a state-independent vector of d parameters.
    """

    def _build_heads(
        self, in_size: int, num_actions: int, action_dim: int, log_std_init: float
    ) -> None:
        if (num_actions > 0) == (action_dim > 0):
            raise ValueError(
                f"give num_actions (discrete) or action_dim (continuous), got {num_actions}"
                f" and {action_dim}"
            )
        self.num_actions, self.action_dim = num_actions, action_dim
        self.policy = nn.Linear(in_size, action_dim or num_actions)
        if action_dim:
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        _orthogonal_init(self.policy, _POLICY_GAIN)

    def _action_features(self, last_action: Tensor) -> Tensor:
        """[N] indices -> one-hot [N, num_actions]; continuous [N, d] -> float [N, d]."""
        if self.action_dim:
            return last_action.float()
        return F.one_hot(last_action, self.num_actions).float()

    def _agent_output(
        self, policy_features: Tensor, baseline: Tensor, T: int, B: int
    ) -> AgentOutput | GaussianAgentOutput:
        if not self.action_dim:
            return AgentOutput(self.policy(policy_features).view(T, B, self.num_actions), baseline)
        mean = self.policy(policy_features).view(T, B, self.action_dim)
        return GaussianAgentOutput(mean, self.log_std.expand_as(mean), baseline)


class ActorCriticNet(_PolicyHeads):
    """Shared core and heads; subclasses provide the torso.

    Args:
        torso: maps float32 [N, *obs_shape] to float32 [N, torso_size].
        torso_size: features per sample out of ``torso``.
        obs_shape: shape of one observation.
        num_actions: size of a discrete action space (0 for continuous actions).
        use_lstm: put a one-layer LSTM between the torso and the heads.
        lstm_size: LSTM hidden size (ignored without ``use_lstm``).
        action_dim: d of a continuous action space (0 for discrete actions): a Gaussian
            head (`GaussianAgentOutput`) instead of logits.
        log_std_init: the Gaussian's initial log standard deviation.
    """

    def __init__(
        self,
        torso: nn.Module,
        torso_size: int,
        obs_shape: ObsShape,
        num_actions: int,
        *,
        use_lstm: bool,
        lstm_size: int,
        action_dim: int = 0,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.obs_shape = _obs_shape(obs_shape)
        self.use_lstm = use_lstm
        self.torso = torso
        core_input_size = torso_size + 1 + (action_dim or num_actions)
        self.core: nn.LSTM | None
        if use_lstm:
            self.core = nn.LSTM(core_input_size, lstm_size, num_layers=1)
            core_output_size = lstm_size
        else:
            self.core = None
            core_output_size = core_input_size
        self._build_heads(core_output_size, num_actions, action_dim, log_std_init)
        self.baseline = nn.Linear(core_output_size, 1)
        _orthogonal_init(self.baseline, _BASELINE_GAIN)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> CoreState:
        """Zero recurrent state for ``batch_size`` samples, on ``device``.

        ``device=None`` means the device of the model's parameters.
        """
        if self.core is None:
            return ()
        if device is None:
            device = self.policy.weight.device
        shape = (self.core.num_layers, batch_size, self.core.hidden_size)
        return (torch.zeros(shape, device=device), torch.zeros(shape, device=device))

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: CoreState = ()
    ) -> tuple[AgentOutput | GaussianAgentOutput, CoreState]:
        """Run T steps for B samples. See the module docstring for the ``inputs`` contract.

        For recurrent models an empty ``core_state`` means ``initial_state(B)``. The returned
        state is the one after step T-1, so carrying it into the next call gives the same
        outputs as one call over all steps (up to float32 rounding, see tests/test_models.py).
        """
        obs = inputs["obs"]
        T, B = time_and_batch(obs)
        x = self.torso(float_obs(obs))
        reward = inputs["reward"].flatten(0, 1).float().clamp(-1.0, 1.0).unsqueeze(1)
        last_action = self._action_features(inputs["last_action"].flatten(0, 1))
        core_input = torch.cat([x, reward, last_action], dim=1)

        if self.core is None:
            core_output = core_input
            core_state = ()
        else:
            core_output, core_state = self._unroll(
                core_input.view(T, B, -1), inputs["done"], core_state
            )
            core_output = core_output.flatten(0, 1)

        baseline = self.baseline(core_output).view(T, B)
        return self._agent_output(core_output, baseline, T, B), core_state

    def _unroll(
        self, core_input: Tensor, done: Tensor, core_state: CoreState
    ) -> tuple[Tensor, CoreState]:
        assert self.core is not None
        return _unroll_lstm(self.core, core_input, done, core_state)


def float_obs(obs: Any) -> Any:
    """[T, B, ...] observations (a tensor, or a Dict's or Tuple's structure of them) as
    float32 [T*B, ...]: uint8 pixels scaled by 1/255 here rather than by the caller, so
    rollouts store bytes."""
    if isinstance(obs, Tensor):
        return _float_leaf(obs)
    return map_inputs(_float_leaf, obs)


def _float_leaf(obs: Tensor) -> Tensor:
    x = obs.flatten(0, 1)
    return x.float().div_(255.0) if x.dtype == torch.uint8 else x.float()


def time_and_batch(obs: Any) -> tuple[int, int]:
    """T and B of [T, B, ...] observations (of the first leaf of a Dict or Tuple)."""
    while not isinstance(obs, Tensor):
        obs = next(iter(obs.values())) if isinstance(obs, Mapping) else obs[0]
    return obs.shape[:2]


def _obs_shape(obs_shape: ObsShape) -> ObsShape:
    """A Box's shape as a tuple of ints; a Dict's or Tuple's structure as it is."""
    return tuple(int(d) for d in obs_shape) if _is_shape(obs_shape) else obs_shape


def _is_shape(value: Any) -> bool:
    """Whether `value` is one observation's shape (a tuple of ints), rather than a Dict's
    or Tuple's structure of shapes (`EnvSpec.model_obs_shape`)."""
    return isinstance(value, tuple | list) and all(isinstance(d, int) for d in value)


class MultiInputTorso(nn.Module):
    """A Dict or Tuple observation -> one feature vector: the default multi-input torso.

    Each image leaf ([C, H, W]) goes through its own conv torso (AtariNet's if the image
    is at least ATARI_MIN_SIZE on a side, else the IMPALA ResNet's: both work on one
    frame or a stack); the vector leaves (0-D and 1-D), flattened and concatenated in
    field order, go through one MLP of two ``hidden_size`` layers (``hidden_size=None``:
    none, the vector is the feature). The features are concatenated, images first, as
    Stable-Baselines3's CombinedExtractor does. Any other leaf (a 2-D grid, say) is a
    one-line ValueError naming it.

    Args:
        obs_shape: the leaves' shapes, nested as the observation (`EnvSpec.model_obs_shape`);
            a plain shape is one leaf.
        hidden_size: the vector MLP's width, or None for no MLP.
        activation: the vector MLP's activation (ACTIVATIONS).

    Input: the observation's leaves as float32 [N, ...] (`float_obs`), nested as
    ``obs_shape``. Output: float32 [N, size].
    """

    def __init__(
        self, obs_shape: ObsShape, hidden_size: int | None, activation: str = "relu"
    ) -> None:
        super().__init__()
        shapes = flatten_obs(obs_shape, is_leaf=_is_shape)
        for key, shape in shapes.items():
            if not (len(shape) == 3 or len(shape) <= 1):
                raise ValueError(
                    f"observation leaf {key} has shape {tuple(shape)}: the multi-input model"
                    " encodes [C, H, W] images (a conv torso) and vectors (an MLP); reshape"
                    " it with an ObservationWrapper, or pass --model package.module:Name"
                )
        self.image_keys = [key for key, shape in shapes.items() if len(shape) == 3]
        self.vector_keys = [key for key, shape in shapes.items() if len(shape) <= 1]
        # Where each leaf sits in the observation: found once, not per forward pass.
        self._image_paths = [obs_path(key) for key in self.image_keys]
        self._vector_paths = [obs_path(key) for key in self.vector_keys]
        images = [_image_torso(tuple(shapes[key])) for key in self.image_keys]
        self.image_torsos = nn.ModuleList(torso for torso, _ in images)
        vector_size = sum(math.prod(shapes[key]) for key in self.vector_keys)
        self.vector_torso: nn.Module | None = None
        if self.vector_keys and hidden_size is not None:
            self.vector_torso, vector_size = _mlp_torso((vector_size,), hidden_size, activation)
        self.size = sum(size for _, size in images) + vector_size

    def forward(self, obs: Any) -> Tensor:
        images = zip(self._image_paths, self.image_torsos, strict=True)
        features = [torso(obs_leaf(obs, path)) for path, torso in images]
        if self._vector_paths:
            leaves = [obs_leaf(obs, path) for path in self._vector_paths]
            # shape[0], not len(): a trace (beast/exporting.py) keeps the batch size variable.
            vectors = [leaf.reshape(leaf.shape[0], -1) for leaf in leaves]
            x = vectors[0] if len(vectors) == 1 else torch.cat(vectors, dim=1)
            features.append(x if self.vector_torso is None else self.vector_torso(x))
        return features[0] if len(features) == 1 else torch.cat(features, dim=1)


def _image_torso(shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The multi-input torso's conv torso for one image leaf [C, H, W] (MultiInputTorso)."""
    if min(shape[1:]) >= ATARI_MIN_SIZE:
        return _atari_torso(shape)
    return _resnet_torso(shape)


def _zero_state(core: nn.LSTM, batch_size: int, device: torch.device | str) -> CoreState:
    shape = (core.num_layers, batch_size, core.hidden_size)
    return (torch.zeros(shape, device=device), torch.zeros(shape, device=device))


def _unroll_lstm(
    core: nn.LSTM, core_input: Tensor, done: Tensor, core_state: CoreState
) -> tuple[Tensor, CoreState]:
    """LSTM over core_input [T, B, F], zeroing a sample's state where done[t] is set.

    Rather than stepping the LSTM once per t (TorchBeast), split T at the steps where any
    sample starts an episode and run one LSTM call per chunk: the state is only reset at
    chunk starts, so this is the same computation, but an 80-step learner unroll with no
    episode end is one fused call instead of 80. Returns (output [T, B, lstm_size], state).
    An empty ``core_state`` means zeros.
    """
    T, B = done.shape
    if not core_state:
        core_state = _zero_state(core, B, core_input.device)
    # [T, 1, B, 1]: indexing t gives [1, B, 1], broadcasting over (layers, B, hidden).
    done = done.bool().view(T, 1, B, 1)
    if torch.compiler.is_compiling():
        return _lstm_steps(core, core_input, done, core_state)
    # Chunk starts: 0, then every t > 0 where some sample's episode starts. T == 1 is the
    # actors' path and skips the search, which would cost a host sync on GPU.
    starts = [0]
    if T > 1:
        starts += (done[1:].flatten(1).any(dim=1).nonzero().flatten() + 1).tolist()
    outputs = []
    for start, end in zip(starts, [*starts[1:], T], strict=True):
        # masked_fill, not a multiply by (1 - done): a reset must also clear NaN/inf (e.g.
        # debug sentinels in an unwritten state buffer), and 0 * NaN is NaN.
        core_state = tuple(s.masked_fill(done[start], 0.0) for s in core_state)
        output, core_state = core(core_input[start:end], core_state)
        outputs.append(output)
    return (outputs[0] if len(outputs) == 1 else torch.cat(outputs)), tuple(core_state)


def _lstm_steps(
    core: nn.LSTM, core_input: Tensor, done: Tensor, core_state: CoreState
) -> tuple[Tensor, CoreState]:
    """`_unroll_lstm` for a compiled learner step (beast/train_step.py): finding the chunk
    starts reads the batch on the host, which a graph cannot, so here every step resets
    its samples' state and runs the LSTM's cell arithmetic (nn.LSTM's: gates i, f, g, o;
    c' = f c + i g, h' = o tanh(c')), the input's part of every gate for all T steps in one
    matrix product. One layer, no projection, as beast's models build it."""
    if core.num_layers != 1 or core.proj_size or core.bidirectional or not core.bias:
        raise ModelError("a compiled step runs one-layer, unidirectional LSTMs with biases")
    weight_ih, weight_hh = core.weight_ih_l0, core.weight_hh_l0
    input_gates = core_input @ weight_ih.t() + core.bias_ih_l0 + core.bias_hh_l0  # [T, B, 4H]
    h, c = core_state[0][0], core_state[1][0]  # [B, H]
    outputs = []
    for t in range(core_input.shape[0]):
        reset = done[t, 0]  # [B, 1]
        h, c = h.masked_fill(reset, 0.0), c.masked_fill(reset, 0.0)
        gates = input_gates[t] + h @ weight_hh.t()
        i, f, g, o = gates.chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        outputs.append(h)
    return torch.stack(outputs), (h.unsqueeze(0), c.unsqueeze(0))


class AtariNet(ActorCriticNet):
    """TorchBeast's AtariNet (the Nature-DQN torso) for [C, H, W] images with H, W >= 36.

    conv 32 8x8 s4 -> ReLU -> conv 64 4x4 s2 -> ReLU -> conv 64 3x3 s1 -> ReLU -> fc 512 -> ReLU.
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        *,
        use_lstm: bool = False,
        lstm_size: int = DEFAULT_LSTM_SIZE,
        action_dim: int = 0,
        log_std_init: float = 0.0,
    ) -> None:
        obs_shape = tuple(obs_shape)
        torso, torso_size = _atari_torso(obs_shape)
        super().__init__(
            torso,
            torso_size,
            obs_shape,
            num_actions,
            use_lstm=use_lstm,
            lstm_size=lstm_size,
            action_dim=action_dim,
            log_std_init=log_std_init,
        )


def _atari_torso(obs_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The Nature-DQN torso (see AtariNet), initialised; returns (torso, features)."""
    _check_image_shape(obs_shape, "atari")
    convs = nn.Sequential(
        nn.Conv2d(obs_shape[0], 32, kernel_size=8, stride=4),
        nn.ReLU(),
        nn.Conv2d(32, 64, kernel_size=4, stride=2),
        nn.ReLU(),
        nn.Conv2d(64, 64, kernel_size=3, stride=1),
        nn.ReLU(),
        nn.Flatten(),
    )
    torso = nn.Sequential(convs, nn.Linear(_flat_size(convs, obs_shape, "atari"), 512), nn.ReLU())
    _orthogonal_init(torso, _RELU_GAIN)
    return torso, 512


class _ResidualBlock(nn.Module):
    """x + conv(ReLU(conv(ReLU(x)))), 3x3 convs with same padding."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, kernel_size=3, padding=1)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ResNet(ActorCriticNet):
    """The IMPALA deep ResNet (Espeholt et al. 2018, fig. 3, right) for [C, H, W] images.

    Three sections of 16, 32, 32 channels, each: conv 3x3 -> maxpool 3x3 s2 -> two residual
    blocks; then ReLU -> flatten -> fc 256 -> ReLU. The max-pool pads by 1, which gives
    TensorFlow's "SAME" output size ceil(H / 2) (84 -> 42 -> 21 -> 11).
    """

    def __init__(
        self,
        obs_shape: Sequence[int],
        num_actions: int,
        *,
        use_lstm: bool = False,
        lstm_size: int = DEFAULT_LSTM_SIZE,
        action_dim: int = 0,
        log_std_init: float = 0.0,
    ) -> None:
        obs_shape = tuple(obs_shape)
        torso, torso_size = _resnet_torso(obs_shape)
        super().__init__(
            torso,
            torso_size,
            obs_shape,
            num_actions,
            use_lstm=use_lstm,
            lstm_size=lstm_size,
            action_dim=action_dim,
            log_std_init=log_std_init,
        )


def _resnet_torso(obs_shape: tuple[int, ...]) -> tuple[nn.Module, int]:
    """The IMPALA deep ResNet torso (see ResNet), initialised; returns (torso, features)."""
    _check_image_shape(obs_shape, "resnet")
    layers: list[nn.Module] = []
    in_channels = obs_shape[0]
    for channels in (16, 32, 32):
        layers += [
            nn.Conv2d(in_channels, channels, kernel_size=3, padding=1),
            nn.MaxPool2d(kernel_size=3, stride=2, padding=1),
            _ResidualBlock(channels),
            _ResidualBlock(channels),
        ]
        in_channels = channels
    convs = nn.Sequential(*layers, nn.ReLU(), nn.Flatten())
    torso = nn.Sequential(convs, nn.Linear(_flat_size(convs, obs_shape, "resnet"), 256), nn.ReLU())
    _orthogonal_init(torso, _RELU_GAIN)
    return torso, 256


class MLPNet(ActorCriticNet):
    """Two hidden layers of ``hidden_size`` units (ReLU by default) on the flattened
    observation.

    ReLU rather than the tanh of CleanRL's and Stable-Baselines3's classic-control defaults:
    in a quick A2C check on CartPole-v1 with this net (8 envs, 20-step rollouts, Adam 2e-3,
    250k steps, 3 seeds), ReLU averaged 457, 269 and 500 over the last 20% of training and
    tanh 227, 226 and 235 (206, 243 and 231 with gain sqrt(2) instead of 5/3). The LSTM, when
    used, has ``hidden_size`` units too.
    """

    def __init__(
        self,
        obs_shape: ObsShape,
        num_actions: int,
        *,
        use_lstm: bool = False,
        hidden_size: int = DEFAULT_MLP_HIDDEN_SIZE,
        activation: str = "relu",
        action_dim: int = 0,
        log_std_init: float = 0.0,
    ) -> None:
        obs_shape = _obs_shape(obs_shape)
        torso, torso_size = _mlp_torso(obs_shape, hidden_size, activation)
        super().__init__(
            torso,
            torso_size,
            obs_shape,
            num_actions,
            use_lstm=use_lstm,
            lstm_size=hidden_size,
            action_dim=action_dim,
            log_std_init=log_std_init,
        )


def _mlp_torso(
    obs_shape: ObsShape, hidden_size: int, activation: str = "relu"
) -> tuple[nn.Module, int]:
    """Two layers of hidden_size on the flattened obs (see MLPNet), initialised with gain
    sqrt(2) whatever the activation (as Stable-Baselines3 and CleanRL do); for a Dict or
    Tuple observation (a structure of shapes), the multi-input torso with such an MLP."""
    if not _is_shape(obs_shape):
        torso = MultiInputTorso(obs_shape, hidden_size, activation)
        return torso, torso.size
    act = ACTIVATIONS[activation]
    torso = nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(obs_shape), hidden_size),
        act(),
        nn.Linear(hidden_size, hidden_size),
        act(),
    )
    _orthogonal_init(torso, _RELU_GAIN)
    return torso, hidden_size


class SeparateMLPNet(_PolicyHeads):
    """Two MLPs on the observation alone: one to the policy head, one to the value.

    Stable-Baselines3's ``net_arch=dict(pi=[h, h], vf=[h, h])`` and CleanRL's PPO networks:
    no shared layers, so the value loss does not shape the policy's features, and no
    reward or last-action input. Feed-forward only (``initial_state`` is ``()``).
    """

    def __init__(
        self,
        obs_shape: ObsShape,
        num_actions: int,
        *,
        hidden_size: int = DEFAULT_MLP_HIDDEN_SIZE,
        activation: str = "tanh",
        action_dim: int = 0,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.obs_shape = _obs_shape(obs_shape)
        self.policy_torso, size = _mlp_torso(self.obs_shape, hidden_size, activation)
        self.value_torso, _ = _mlp_torso(self.obs_shape, hidden_size, activation)
        self._build_heads(size, num_actions, action_dim, log_std_init)
        self.baseline = nn.Linear(size, 1)
        _orthogonal_init(self.baseline, _BASELINE_GAIN)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> CoreState:
        return ()

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: CoreState = ()
    ) -> tuple[AgentOutput | GaussianAgentOutput, CoreState]:
        obs = inputs["obs"]
        T, B = time_and_batch(obs)
        x = float_obs(obs)
        baseline = self.baseline(self.value_torso(x)).view(T, B)
        return self._agent_output(self.policy_torso(x), baseline, T, B), ()


def _resolve_model_name(
    name: str,
    obs_shape: ObsShape,
    num_actions: int,
    hidden_size: int | None,
    action_dim: int = 0,
) -> tuple[str, ObsShape]:
    """The checks both builders share; "auto" resolved by the observation's rank, and to
    "mlp" (the multi-input torso) for a Dict or Tuple observation."""
    if name not in MODEL_NAMES:
        raise ValueError(f"unknown model {name!r}; expected one of {MODEL_NAMES}")
    if max(num_actions, action_dim) < 1:
        raise ValueError(f"num_actions must be >= 1, got {num_actions}")
    if hidden_size is not None and hidden_size < 1:
        raise ValueError(f"hidden_size must be >= 1, got {hidden_size}")
    if not _is_shape(obs_shape):
        if name in ("atari", "resnet"):
            raise ValueError(
                f"the {name} model reads one image observation; for Dict or Tuple"
                " observations use auto (the multi-input model: a conv torso per image leaf,"
                " an MLP on the vector leaves), mlp or separate_mlp"
            )
        return ("mlp" if name == "auto" else name), obs_shape
    obs_shape = tuple(int(d) for d in obs_shape)
    if not obs_shape or min(obs_shape) < 1:
        raise ValueError(f"obs_shape must be non-empty with positive sizes, got {obs_shape}")
    if name == "auto":
        if len(obs_shape) == 3:
            name = "atari"
        elif len(obs_shape) == 1:
            name = "mlp"
        else:
            raise ValueError(
                f"model 'auto' needs 1-D vector or 3-D [C, H, W] obs, got obs_shape {obs_shape}; "
                "name a model explicitly"
            )
    return name, obs_shape


def build_model(
    name: str,
    obs_shape: ObsShape,
    num_actions: int,
    *,
    use_lstm: bool = False,
    hidden_size: int | None = None,
    activation: str | None = None,
    action_dim: int = 0,
    log_std_init: float = 0.0,
) -> ActorCriticNet | SeparateMLPNet:
    """Build an actor-critic model by name (one of MODEL_NAMES).

    "auto" picks "atari" for 3-D [C, H, W] observations and "mlp" for 1-D vectors. "mlp"
    and "separate_mlp" accept any shape (they flatten), so small grids can use them too;
    "atari" and "resnet" need 3-D images, and "atari" needs H, W >= 36. For a Dict or
    Tuple observation (``obs_shape`` the leaves' shapes, nested), "auto" and "mlp" build
    `MLPNet` and "separate_mlp" `SeparateMLPNet` with the multi-input torso
    (`MultiInputTorso`) in place of each MLP torso; "atari" and "resnet" are refused.

    ``hidden_size`` sets the MLP models' layer and LSTM width (default 64) and the image
    models' LSTM width (default 256). Image models have no other width to set, so passing
    it for one without ``use_lstm`` is an error rather than silently ignored; so is an
    ``activation`` (the MLPs': relu for "mlp", tanh for "separate_mlp" by default) for an
    image model. ``action_dim`` > 0 (with ``num_actions`` 0) gives a Gaussian head for
    continuous actions, starting at ``log_std_init``.

    Raises:
        ValueError: unknown name, impossible shape, or a non-positive size.
    """
    name, obs_shape = _resolve_model_name(name, obs_shape, num_actions, hidden_size, action_dim)
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {list(ACTIVATIONS)}")
    heads = {"action_dim": action_dim, "log_std_init": log_std_init}
    width = hidden_size or DEFAULT_MLP_HIDDEN_SIZE
    if name == "mlp":
        return MLPNet(
            obs_shape,
            num_actions,
            use_lstm=use_lstm,
            hidden_size=width,
            activation=activation or "relu",
            **heads,
        )
    if name == "separate_mlp":
        if use_lstm:
            raise ValueError("the separate_mlp model is feed-forward; use mlp for an LSTM")
        return SeparateMLPNet(
            obs_shape, num_actions, hidden_size=width, activation=activation or "tanh", **heads
        )
    if hidden_size is not None and not use_lstm:
        raise ValueError(
            f"hidden_size sets the LSTM width of the {name} model; it has no effect without "
            "use_lstm"
        )
    if activation is not None:
        raise ValueError(f"activation sets the MLP models' activation, not the {name} model's")
    image_cls = AtariNet if name == "atari" else ResNet
    return image_cls(
        obs_shape,
        num_actions,
        use_lstm=use_lstm,
        lstm_size=hidden_size or DEFAULT_LSTM_SIZE,
        **heads,
    )


# Q-networks for R2D2 and Ape-X.

# R2D2's LSTM (Kapturowski et al. 2019, section 2.3) and the width of each dueling stream for
# the image torsos (R2D2 and Ape-X: 512).
DEFAULT_Q_LSTM_SIZE = 512
DEFAULT_Q_HEAD_SIZE = 512


class QOutput(NamedTuple):
    """What a Q-network returns for each step.

    q_values: float32 [T, B, num_actions], Q(x_t, a) for every action a.
    """

    q_values: Tensor


class DistributionalQOutput(NamedTuple):
    """What a distributional Q-network returns for each step (C51, Rainbow).

    q_logits: float32 [T, B, num_actions, num_atoms], the logits of each action's return
        distribution over the algorithm's fixed support (Bellemare et al. 2017).
    """

    q_logits: Tensor


class QNet(nn.Module):
    """torso -> [LSTM] -> Q head, dueling or not, with one value or a distribution per action.

    Dueling (Wang et al. 2016, eq. 9): ``Q = V + A - mean_a A``, from a value stream and an
    advantage stream, each ``Linear(head_size) -> ReLU -> Linear`` (one ``Linear`` on the
    MLP torso); subtracting the mean
    advantage makes V and A identifiable without changing the greedy action. Without it,
    one such stream gives Q. With ``num_atoms`` > 1 every output is a vector of logits
    over the atoms (C51), and the dueling sum is taken per atom (Rainbow, section 3).

    Args:
        torso: maps float32 [N, *obs_shape] to float32 [N, torso_size].
        torso_size: features per sample out of ``torso``.
        obs_shape: shape of one observation.
        num_actions: size of the discrete action space.
        use_lstm: R2D2's recurrent core, fed ``[features, clipped reward, one-hot last action]``
            and reset per sample at ``done``; without it the head reads the features only.
        lstm_size: LSTM hidden size (ignored without ``use_lstm``).
        head_size: width of each stream's hidden layer; None for streams of one linear
            layer (the MLP torso's layers are the hidden ones, as in SB3's QNetwork).
        dueling: the dueling head, else one stream.
        num_atoms: 1 for Q-values (`QOutput`), else the atoms of a distributional head
            (`DistributionalQOutput`).
    """

    def __init__(
        self,
        torso: nn.Module,
        torso_size: int,
        obs_shape: ObsShape,
        num_actions: int,
        *,
        use_lstm: bool,
        lstm_size: int,
        head_size: int | None,
        dueling: bool = True,
        num_atoms: int = 1,
    ) -> None:
        super().__init__()
        self.obs_shape = _obs_shape(obs_shape)
        self.num_actions = num_actions
        self.num_atoms = num_atoms
        self.use_lstm = use_lstm
        self.torso = torso
        self.core: nn.LSTM | None
        if use_lstm:
            self.core = nn.LSTM(torso_size + 1 + num_actions, lstm_size, num_layers=1)
            head_input_size = lstm_size
        else:
            self.core = None
            head_input_size = torso_size

        def stream(outputs: int) -> nn.Sequential:
            if head_size is None:
                layers = nn.Sequential(nn.Linear(head_input_size, outputs))
                _orthogonal_init(layers[0], 1.0)
                return layers
            layers = nn.Sequential(
                nn.Linear(head_input_size, head_size), nn.ReLU(), nn.Linear(head_size, outputs)
            )
            _orthogonal_init(layers[0], _RELU_GAIN)
            _orthogonal_init(layers[2], 1.0)
            return layers

        self.value = stream(num_atoms) if dueling else None
        # The advantage stream of a dueling head, or the Q stream itself.
        self.action_values = stream(num_actions * num_atoms)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> CoreState:
        """Zero recurrent state for ``batch_size`` samples (``()`` without an LSTM)."""
        if self.core is None:
            return ()
        if device is None:
            device = self.action_values[0].weight.device
        return _zero_state(self.core, batch_size, device)

    def forward(
        self, inputs: Mapping[str, Tensor], core_state: CoreState = ()
    ) -> tuple[QOutput | DistributionalQOutput, CoreState]:
        """Run T steps for B samples; the ``inputs`` contract is the module docstring's.

        Feed-forward models read only ``inputs["obs"]`` and return the empty state.
        """
        obs = inputs["obs"]
        T, B = time_and_batch(obs)
        x = self.torso(float_obs(obs))
        if self.core is None:
            core_output = x
            core_state = ()
        else:
            with _float32(x):
                reward = inputs["reward"].flatten(0, 1).float().clamp(-1.0, 1.0).unsqueeze(1)
                last_action = F.one_hot(inputs["last_action"].flatten(0, 1), self.num_actions)
                core_input = torch.cat([x.float(), reward, last_action.float()], dim=1)
                core_output, core_state = _unroll_lstm(
                    self.core, core_input.view(T, B, -1), inputs["done"], core_state
                )
                core_output = core_output.flatten(0, 1)
        q = _output_in_float32(self.action_values, core_output)
        q = q.view(T * B, self.num_actions, self.num_atoms)
        if self.value is not None:
            value = _output_in_float32(self.value, core_output).unsqueeze(1)
            q = value + q - q.mean(dim=1, keepdim=True)
        if self.num_atoms > 1:
            return DistributionalQOutput(q.view(T, B, self.num_actions, self.num_atoms)), core_state
        return QOutput(q.view(T, B, self.num_actions)), core_state


def _float32(x: Tensor) -> torch.autocast:
    """No autocast inside (a bf16 learner's, --precision): float32 arithmetic."""
    return torch.autocast(x.device.type, enabled=False)


def _output_in_float32(stream: nn.Sequential, x: Tensor) -> Tensor:
    """A Q stream whose last layer runs in float32 whatever the autocast around it: a bf16
    learner (--precision) runs the torso's convolutions and the streams' hidden layers in
    bf16 where the CPU or GPU has it, and the Q-values keep the resolution their targets
    need (bf16's 8 bits are 0.016 at Q = 3, as fine as late TD errors). The recurrent
    core runs in float32 too: its state carries rounding from step to step."""
    hidden = stream[:-1](x)
    with _float32(hidden):
        return stream[-1](hidden.float())


def build_q_model(
    name: str,
    obs_shape: ObsShape,
    num_actions: int,
    *,
    use_lstm: bool = False,
    hidden_size: int | None = None,
    dueling: bool = True,
    num_atoms: int = 1,
) -> QNet:
    """Build a Q-network by torso name (one of MODEL_NAMES, as `build_model`).

    "auto" picks "atari" for 3-D [C, H, W] observations and "mlp" for 1-D vectors; for a
    Dict or Tuple observation, "auto" and "mlp" take the multi-input torso
    (`MultiInputTorso`) with an MLP of ``hidden_size``, as `build_model` does.

    ``hidden_size`` sets the MLP torso's layer width and its LSTM (default 64), whose
    streams are then one linear layer each (the torso's two layers are the hidden ones);
    for the image torsos it sets the LSTM width (default 512, R2D2's), and is an
    error without ``use_lstm``; their head streams are 512 wide (DQN, R2D2, Ape-X).
    ``dueling`` and ``num_atoms``: see `QNet`.

    Raises:
        ValueError: unknown name, impossible shape, or a non-positive size.
    """
    name, obs_shape = _resolve_model_name(name, obs_shape, num_actions, hidden_size)
    if num_atoms < 1:
        raise ValueError(f"num_atoms must be >= 1, got {num_atoms}")
    if name == "separate_mlp":
        raise ValueError(
            "separate_mlp is an actor-critic network; Q-networks use mlp, atari or resnet"
        )
    head = {"use_lstm": use_lstm, "dueling": dueling, "num_atoms": num_atoms}
    if name == "mlp":
        width = hidden_size or DEFAULT_MLP_HIDDEN_SIZE
        torso, torso_size = _mlp_torso(obs_shape, width)
        return QNet(
            torso, torso_size, obs_shape, num_actions, lstm_size=width, head_size=None, **head
        )
    if hidden_size is not None and not use_lstm:
        raise ValueError(
            f"hidden_size sets the LSTM width of the {name} model; it has no effect without "
            "use_lstm"
        )
    torso, torso_size = _atari_torso(obs_shape) if name == "atari" else _resnet_torso(obs_shape)
    return QNet(
        torso,
        torso_size,
        obs_shape,
        num_actions,
        lstm_size=hidden_size or DEFAULT_Q_LSTM_SIZE,
        head_size=DEFAULT_Q_HEAD_SIZE,
        **head,
    )


# Models from the user (--model package.module:Name), and the start-up check of any model.


class ModelError(ValueError):
    """A network that cannot be built or does not fit the algorithm or the env; the message
    is one line for the user (entry points exit 2)."""


# What a model that does not fit the env raises when built or run on it (a user's model
# written for a Box, given a Dict's shapes): reported in one line, never a traceback.
_MODEL_ERRORS = (TypeError, ValueError, RuntimeError, AttributeError, KeyError, IndexError)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def is_user_model(name: str) -> bool:
    """True for `package.module:Name`, a model given by import path."""
    return ":" in name


def _import_model(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ModelError(f"--model {path!r} is not an import path; write package.module:Name")
    try:
        module = import_module(module_name)
    except ImportError as error:
        missing = getattr(error, "name", None)
        if missing and (module_name == missing or module_name.startswith(missing + ".")):
            raise ModelError(
                f"--model {path}: cannot import module '{module_name}' (check the path, and"
                " that the package is installed or on PYTHONPATH)"
            ) from None
        raise ModelError(f"--model {path}: importing '{module_name}' failed: {error}") from error
    factory: Any = module
    for part in attribute.split("."):
        factory = getattr(factory, part, None)
        if factory is None:
            raise ModelError(f"--model {path}: module '{module_name}' has no '{attribute}'")
    if not callable(factory):
        raise ModelError(f"--model {path} is not callable; point it at a class or a factory")
    return factory


def build_user_model(config: Any, spec: Any) -> nn.Module:
    """`Name(obs_shape=..., num_actions=...)` for `--model package.module:Name` (for a
    continuous action space: `Name(obs_shape=..., action_dim=...)`; for a Dict or Tuple
    observation, obs_shape is the leaves' shapes nested as the observation,
    `EnvSpec.model_obs_shape`): an nn.Module with `initial_state(batch_size)` and
    `forward(inputs, core_state)` (the contract of this module's docstring;
    docs/models.md). ModelError, one line, when the path does not
    import or the call does not fit."""
    path = config.model
    factory = _import_model(path)
    kwargs = {"obs_shape": spec.model_obs_shape()}
    if spec.continuous:
        kwargs["action_dim"] = spec.action_dim
    else:
        kwargs["num_actions"] = spec.num_actions
    try:
        inspect.signature(factory).bind(**kwargs)
    except TypeError as error:
        raise ModelError(
            f"--model {path} must accept ({', '.join(kwargs)}) as keyword arguments for"
            f" {spec.describe_actions()}: {error}"
        ) from None
    except ValueError:  # a callable without a signature (a C function): just call it
        pass
    try:
        model = factory(**kwargs)
    except _MODEL_ERRORS as error:
        raise ModelError(
            f"--model {path} cannot be built for {spec.describe_obs()} observations"
            f" ({', '.join(f'{k}={v!r}' for k, v in kwargs.items())}; docs/models.md):"
            f" {_first_line(error)}"
        ) from None
    if not isinstance(model, nn.Module):
        raise ModelError(f"--model {path} returned {type(model).__name__}, not a torch nn.Module")
    if not callable(getattr(model, "initial_state", None)):
        raise ModelError(
            f"--model {path} has no initial_state(batch_size) method; return () from it for"
            " a feed-forward model (docs/models.md)"
        )
    return model


def check_model(
    model: nn.Module, spec: Any, outputs: Mapping[str, tuple[int, ...]], name: str
) -> None:
    """Run `model` once on a [T=2, B=2] batch of zeros shaped like the env's, and check that
    it returns the `outputs` the algorithm needs, `[T, B, *shape]` each, and a state it
    takes back. ModelError (one line naming `name`, the --model flag) otherwise, at
    start-up, rather than a traceback from an actor or the learner."""
    T, B = 2, 2
    obs = spec.obs_fields()
    fields = {
        **{key: torch.zeros((T, B, *f.shape), dtype=f.dtype) for key, f in obs.items()},
        "reward": torch.zeros((T, B)),
        "done": torch.zeros((T, B), dtype=torch.bool),
        "last_action": torch.zeros((T, B, *spec.action_shape), dtype=spec.action_field().dtype),
    }
    inputs = model_inputs(fields)
    try:
        with torch.no_grad():
            state = model.initial_state(B)
            result = model(inputs, state)
            result, state = result
            model(map_inputs(lambda value: value[:1], inputs), state)
    except _MODEL_ERRORS as error:
        raise ModelError(
            f"--model {name} does not run on {spec.describe_obs()} observations"
            " (model(inputs, core_state) -> (outputs, core_state), docs/models.md):"
            f" {_first_line(error)}"
        ) from None
    try:
        got = result if isinstance(result, Mapping) else result._asdict()
    except AttributeError:
        raise ModelError(
            f"--model {name} returned {type(result).__name__} outputs; return a dict (or a"
            f" NamedTuple) with {', '.join(outputs)}"
        ) from None
    for key, shape in outputs.items():
        if key not in got:
            raise ModelError(
                f"--model {name} returns {', '.join(got) or 'nothing'}; this algorithm needs"
                f" {', '.join(f'{k} [T, B{_dims(s)}]' for k, s in outputs.items())}"
            )
        if tuple(got[key].shape) != (T, B, *shape):
            raise ModelError(
                f"--model {name} returns {key} of shape {tuple(got[key].shape)} for T={T},"
                f" B={B}; expected [T, B{_dims(shape)}]"
            )


def _dims(shape: tuple[int, ...]) -> str:
    return "".join(f", {d}" for d in shape)


def copy_weights(destination: nn.Module, source: nn.Module) -> None:
    """Copy `source`'s weights into `destination` in place (shared memory stays shared)."""
    with torch.no_grad():
        for shared, own in zip(
            destination.state_dict().values(), source.state_dict().values(), strict=True
        ):
            shared.copy_(own)


class WeightCopier:
    """`copy_weights(destination, source)` as a call with both models' tensors listed once:
    the learner publishes after every update, and walking two state dicts cost about as
    much as copying a small MLP's weights (0.13 ms of a DQN CartPole update's 1.7).
    Valid while both models keep their tensors (updates, `load_state_dict` and
    `share_memory` all write in place)."""

    def __init__(self, destination: nn.Module, source: nn.Module) -> None:
        self.destination = list(destination.state_dict().values())
        self.source = list(source.state_dict().values())
        if len(self.destination) != len(self.source):
            raise ValueError("the two models have different state dicts")
        self.same_device = all(
            d.device == s.device for d, s in zip(self.destination, self.source, strict=True)
        )

    @torch.no_grad()
    def __call__(self) -> None:
        if self.same_device:
            torch._foreach_copy_(self.destination, self.source)
            return
        for shared, own in zip(self.destination, self.source, strict=True):
            shared.copy_(own)


class PolyakAverager:
    """``theta- <- tau * theta + (1 - tau) * theta-`` for every floating-point parameter and
    buffer of `target` (Lillicrap et al. 2016, DDPG section 7); other buffers (counters)
    are copied. tau = 1 is a hard copy (DQN's periodic target update).

    Both models' tensors are listed once and averaged by one foreach call: SAC and TD3
    average after every update, where walking the state dicts cost as much as the
    arithmetic. Valid while both models keep their tensors (as `WeightCopier`)."""

    def __init__(self, target: nn.Module, online: nn.Module) -> None:
        pairs = list(zip(target.state_dict().values(), online.state_dict().values(), strict=True))
        averaged = [t.is_floating_point() and t.dtype == o.dtype for t, o in pairs]
        self.targets = [t for (t, _), a in zip(pairs, averaged, strict=True) if a]
        self.onlines = [o for (_, o), a in zip(pairs, averaged, strict=True) if a]
        self.other = [pair for pair, a in zip(pairs, averaged, strict=True) if not a]

    @torch.no_grad()
    def __call__(self, tau: float) -> None:
        if not 0.0 < tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {tau}")
        if tau == 1.0:
            torch._foreach_copy_(self.targets, self.onlines)
        elif self.targets:
            torch._foreach_lerp_(self.targets, self.onlines, tau)
        for theirs, mine in self.other:
            if tau == 1.0 or not theirs.is_floating_point():
                theirs.copy_(mine)
            else:
                theirs.lerp_(mine.to(theirs.dtype), tau)


def polyak_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """One `PolyakAverager` step: `target` moves `tau` of the way to `online`."""
    PolyakAverager(target, online)(tau)
