"""Actor-critic networks for IMPALA-style agents, and dueling Q-networks for R2D2 / Ape-X.

Every model is ``torso -> core -> heads`` and runs on time-major batches:

    inputs["obs"]          [T, B, *obs_shape]  uint8 images (scaled by 1/255 inside the
                                               model, so uint8 travels end to end), or
                                               float32 vectors (used as they are); for a
                                               Dict or Tuple observation, a dict (tuple)
                                               of such tensors, one per leaf, nested as
                                               the space is
    inputs["reward"]       [T, B] float32      raw reward that arrived with obs_t; a model
                                               that reads it clips it to [-1, 1] for the
                                               core input
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
AtariNet for the image models and every LSTM, and the torso's features alone for a
feed-forward MLP, which acts on the observation as Stable-Baselines3's and CleanRL's do (an
exported policy then takes the observation only); ``use_last_action_reward`` (the flag
--use_last_action_reward) says otherwise. Without an LSTM the heads read the core input
directly; with one, they read the LSTM output. The policy and baseline heads are separate
linear layers on a shared torso and core.

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
without one (Ape-X) the head reads the torso features alone, as in the Ape-X paper's dueling DQN
(unless ``use_last_action_reward``).

The package, one module per family (docs/internals.md):

    base.py          outputs (`AgentOutput`, `GaussianAgentOutput`), `CoreState`, model
                     names and widths, initialisation, float observations, `ModelError`
    lstm.py          the trunk both kinds share: torso -> LSTM core, unrolled with
                     resets at episode starts
    actor_critic.py  `ActorCriticNet`: core, policy head (logits or Gaussian), baseline
    atari.py         `AtariNet` and its torso      resnet.py  `ResNet` and its torso
    mlp.py           `MLPNet`, `SeparateMLPNet`, the MLP and multi-input torsos
    q.py             `QNet`: dueling and distributional Q heads
    build.py         `build_model`, `build_q_model`: networks by --model name
    user.py          --model package.module:Name, and `check_model` for any model
    weights.py       `copy_weights`, `WeightCopier`, `PolyakAverager`, `BufferAverager`:
                     publishing, targets
"""

from beast.models.actor_critic import ActorCriticNet
from beast.models.atari import AtariNet
from beast.models.base import (
    MODEL_NAMES,
    AgentOutput,
    CoreState,
    GaussianAgentOutput,
    ModelError,
    ObsShape,
    float_obs,
    time_and_batch,
)
from beast.models.build import build_model, build_q_model
from beast.models.mlp import MLPNet, MultiInputTorso, SeparateMLPNet
from beast.models.q import DistributionalQOutput, QNet, QOutput
from beast.models.resnet import ResNet
from beast.models.user import build_user_model, check_model, is_user_model
from beast.models.weights import (
    BufferAverager,
    PolyakAverager,
    WeightCopier,
    copy_weights,
    polyak_update,
)

__all__ = [
    "ActorCriticNet",
    "AgentOutput",
    "AtariNet",
    "CoreState",
    "DistributionalQOutput",
    "GaussianAgentOutput",
    "MLPNet",
    "MODEL_NAMES",
    "ModelError",
    "MultiInputTorso",
    "ObsShape",
    "BufferAverager",
    "PolyakAverager",
    "QNet",
    "QOutput",
    "ResNet",
    "SeparateMLPNet",
    "WeightCopier",
    "build_model",
    "build_q_model",
    "build_user_model",
    "check_model",
    "copy_weights",
    "float_obs",
    "is_user_model",
    "polyak_update",
    "time_and_batch",
]
