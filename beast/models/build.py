"""Built-in networks by name (--model, one of MODEL_NAMES): `build_model` for
actor-critic algorithms, `build_q_model` for Q-learning ones.
"""

from __future__ import annotations

from beast.models.actor_critic import ActorCriticNet
from beast.models.atari import AtariNet, _atari_torso
from beast.models.base import (
    ACTIVATIONS,
    DEFAULT_LSTM_SIZE,
    DEFAULT_MLP_HIDDEN_SIZE,
    MODEL_NAMES,
    ObsShape,
    _is_shape,
)
from beast.models.mlp import MLPNet, SeparateMLPNet, _mlp_torso
from beast.models.q import DEFAULT_Q_HEAD_SIZE, DEFAULT_Q_LSTM_SIZE, QNet
from beast.models.resnet import ResNet, _resnet_torso

__all__ = [
    "build_model",
    "build_q_model",
]


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
    use_last_action_reward: bool | None = None,
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

    ``use_last_action_reward``: whether the network also reads the last action and reward
    (None: the image models and LSTMs do, a feed-forward "mlp" acts on the observation
    alone); "separate_mlp" always acts on the observation alone.

    Raises:
        ValueError: unknown name, impossible shape, or a non-positive size.
    """
    name, obs_shape = _resolve_model_name(name, obs_shape, num_actions, hidden_size, action_dim)
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}; expected one of {list(ACTIVATIONS)}")
    heads = {
        "action_dim": action_dim,
        "log_std_init": log_std_init,
        "use_last_action_reward": use_last_action_reward,
    }
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
        if heads.pop("use_last_action_reward"):
            raise ValueError(
                "the separate_mlp model reads the observation alone; use mlp to feed the"
                " network the last action and reward"
            )
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


def build_q_model(
    name: str,
    obs_shape: ObsShape,
    num_actions: int,
    *,
    use_lstm: bool = False,
    hidden_size: int | None = None,
    dueling: bool = True,
    num_atoms: int = 1,
    use_last_action_reward: bool | None = None,
) -> QNet:
    """Build a Q-network by torso name (one of MODEL_NAMES, as `build_model`).

    "auto" picks "atari" for 3-D [C, H, W] observations and "mlp" for 1-D vectors; for a
    Dict or Tuple observation, "auto" and "mlp" take the multi-input torso
    (`MultiInputTorso`) with an MLP of ``hidden_size``, as `build_model` does.

    ``hidden_size`` sets the MLP torso's layer width and its LSTM (default 64), whose
    streams are then one linear layer each (the torso's two layers are the hidden ones);
    for the image torsos it sets the LSTM width (default 512, R2D2's), and is an
    error without ``use_lstm``; their head streams are 512 wide (DQN, R2D2, Ape-X).
    ``dueling``, ``num_atoms`` and ``use_last_action_reward`` (None: with the LSTM only):
    see `QNet`.

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
    head = {
        "use_lstm": use_lstm,
        "dueling": dueling,
        "num_atoms": num_atoms,
        "use_last_action_reward": use_last_action_reward,
    }
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
