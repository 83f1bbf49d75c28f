"""Train a policy, export it to ONNX, and play it with onnxruntime: past the export,
nothing of beast runs (docs/export.md).

    pip install -e ".[export]"
    python examples/export_onnx.py

PPO's network acts on the observation alone, so the file takes one input, `obs`
(float32 [B, 4] for CartPole), and gives one output, `action` (int64 [B]).
"""

import os

import gymnasium
import numpy as np
import onnxruntime

import beast

# BEAST_EXAMPLE_STEPS shortens the run (the test suite runs every example so).
STEPS = int(os.environ.get("BEAST_EXAMPLE_STEPS", 100_000))

if __name__ == "__main__":  # actor processes import this script too
    result = beast.train(env="CartPole-v1", algo="ppo", total_steps=STEPS, xpid="ppo_export")
    path = beast.export(result, "onnx")  # RUN_DIR/policy.onnx

    session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    print(
        "inputs",
        [i.name for i in session.get_inputs()],
        "outputs",
        [o.name for o in session.get_outputs()],
    )
    env = gymnasium.make("CartPole-v1")
    obs, _ = env.reset(seed=0)
    total, over = 0.0, False
    while not over:
        (action,) = session.run(["action"], {"obs": obs[None].astype(np.float32)})
        obs, reward, terminated, truncated, _ = env.step(int(action[0]))
        total, over = total + reward, terminated or truncated
    print(f"{path}: an episode of return {total:.0f} with onnxruntime")
