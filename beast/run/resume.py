"""Resume: the checkpoint a run continues from, the checks that it fits, and its load into
the built run. A replay file whose token does not match model.tar's (a crash between the
two writes, or model.tar fell back to model.prev.tar) is left out, and the run says so.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from beast.config import Config, ConfigError
from beast.learning.learner import TrainingProgress
from beast.models import copy_weights
from beast.outputs.checkpoint import (
    CheckpointError,
    has_checkpoint,
    load_latest_checkpoint,
    load_replay_file,
)
from beast.run.build import Run

# Flags a resumed run must share with its checkpoint: they define the model,
# its inputs, the optimizer state's layout or the algorithm's state.
# (--use_last_action_reward is not among them: its default, None, resolves by model, so
# None and True build the same image network; a network that reads otherwise does not fit
# the checkpoint's weights, which `restore` reports.)
RESUME_MUST_MATCH = (
    "env",
    "algo",
    "model",
    "use_lstm",
    "hidden_size",
    "activation",
    "normalize_obs",
    "optimizer",
)
# Flags that may differ on resume without comment.
_RESUME_IGNORED = ("xpid", "savedir", "resume", "mode", "config", "stop_step")


def check_resumable(saved: dict[str, Any], config: Config, path: str) -> list[str]:
    """Raise ConfigError on an incompatible checkpoint; return the other changed flags."""
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    mismatched = [
        f"--{key} {saved.get(key, defaults[key])!r} in the checkpoint, {getattr(config, key)!r} now"
        for key in RESUME_MUST_MATCH
        if saved.get(key, defaults[key]) != getattr(config, key)
    ]
    if mismatched:
        raise ConfigError(
            f"cannot resume from {path}: {'; '.join(mismatched)} (use a new --xpid to start over)"
        )
    current = config.to_dict()
    return [
        f"{key} {saved[key]!r} -> {current[key]!r}"
        for key in current
        if key in saved and key not in _RESUME_IGNORED and saved[key] != current[key]
    ]


def with_current_hyperparameters(saved: Any, current: Any) -> Any:
    """`saved` (an algorithm's state) with every optimizer's param-group settings (base
    learning rate, eps, betas, ...) taken from `current`, the state of the run being
    resumed, built from its flags.

    torch's `Optimizer.load_state_dict` restores the saved groups' settings too, so
    without this a flag changed on resume (`--learning_rate`, which PBT perturbs:
    beast/tune/pbt.py) would be listed as changed and silently not used. The moment
    estimates and step counts stay the checkpoint's; so does `lr`, which the learner sets
    from the base rate and the schedule before every step."""
    if isinstance(saved, dict) and isinstance(current, dict):
        if "param_groups" in saved and "state" in saved and "param_groups" in current:
            groups = [
                {**old, **{k: v for k, v in new.items() if k not in ("params", "lr")}}
                for old, new in zip(saved["param_groups"], current["param_groups"], strict=False)
            ]
            return {**saved, "param_groups": groups}
        return {k: with_current_hyperparameters(v, current.get(k)) for k, v in saved.items()}
    return saved


def load_resume_payload(config: Config) -> tuple[dict[str, Any], str, str | None, list[str]] | None:
    """The checkpoint to resume from, or None for a new run: (payload, its path, why the
    newest file was skipped or None, the flags that changed). ConfigError when --resume
    finds none or the checkpoint does not fit."""
    if config.resume and not has_checkpoint(config.run_dir):
        raise ConfigError(f"--resume: no checkpoint in {config.run_dir}")
    if not has_checkpoint(config.run_dir):
        return None
    try:
        payload, path, skipped = load_latest_checkpoint(config.run_dir)
    except CheckpointError as error:
        raise ConfigError(f"{error} (use a new --xpid to start over)") from error
    changed = check_resumable(payload["config"], config, path)
    return payload, path, skipped, changed


def restore(
    run: Run,
    payload: dict[str, Any],
    path: str,
    *,
    progress_divisor: int = 1,
    with_replay: bool = True,
) -> str:
    """Load a checkpoint into `run` before anything starts; returns what the replay
    restore did ("" without a replay in the checkpoint), for the start-up line.

    progress_divisor: polybeast's learners each count their share of the steps.
    with_replay: False for polybeast's several learners, each with its own replay.
    """
    try:
        run.model.load_state_dict(payload["model_state_dict"])
        copy_weights(run.actor_model, run.model)
        run.update.load_state_dict(
            with_current_hyperparameters(payload["algorithm_state"], run.update.state_dict())
        )
        if run.reward_scaler is not None and payload.get("reward_scaler") is not None:
            run.reward_scaler.load_state_dict(payload["reward_scaler"])
    except (RuntimeError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0]
        saved = payload.get("config", {})
        now = getattr(run.config, "use_last_action_reward", None)
        if "use_last_action_reward" not in saved:
            # Saved before the flag, when the built-in mlp read the reward and last action.
            reason += " (a run saved before --use_last_action_reward: resume it with that flag)"
        elif saved["use_last_action_reward"] != now:
            reason += (
                f" (--use_last_action_reward {saved['use_last_action_reward']!r} in the"
                f" checkpoint, {now!r} now)"
            )
        raise ConfigError(f"cannot resume from {path}: it does not fit: {reason}") from error
    saved = dict(payload["progress"])
    saved["step"] //= progress_divisor
    fields = {f.name for f in dataclasses.fields(TrainingProgress)}
    for key, value in saved.items():
        if key in fields:
            setattr(run.progress, key, value)
    torch.set_rng_state(payload["torch_rng_state"])
    meta = payload.get("replay")
    if meta is None:
        return ""
    if not run.config.checkpoint_replay:
        return "replay not restored (--no-checkpoint_replay): it starts empty"
    if not with_replay:
        return "each learner's replay starts empty (the checkpoint holds one learner's)"
    saved_replay = load_replay_file(run.config.run_dir)
    if saved_replay is None or saved_replay.get("token") != meta["token"]:
        return "the saved replay does not match this checkpoint: the replay starts empty"
    try:
        return "restored " + run.source.restore_replay(saved_replay["tensors"], meta)
    except (ValueError, KeyError) as error:
        return f"the saved replay does not fit ({error}): the replay starts empty"
