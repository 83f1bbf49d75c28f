"""--mode test's video recorder (the rest of test mode runs in test_monobeast.py)."""

import imageio.v2 as imageio
import pytest

from beast import envs
from beast.config import ConfigError
from beast.trained.play import _VideoRecorder


def test_atari_episode_frames_are_written_as_mp4(tmp_path):
    env = envs.make("PongNoFrameskip-v4", seed=0)
    env.reset()
    path = str(tmp_path / "episode.mp4")
    video = _VideoRecorder(env, path)
    for _ in range(12):
        env.step(env.action_space.sample())
        video.capture()
    video.close()
    # The reader reports an unknown (infinite) length, so list() would over-allocate.
    frames = [frame for frame in imageio.get_reader(path)]
    assert len(frames) == 12
    assert frames[0].shape == (210, 160, 3)  # the emulator's RGB screen


def test_env_without_frames_is_a_clear_error(tmp_path):
    env = envs.make("CartPole-v1")
    with pytest.raises(ConfigError, match="--record_video needs an Atari env"):
        _VideoRecorder(env, str(tmp_path / "x.mp4"))
