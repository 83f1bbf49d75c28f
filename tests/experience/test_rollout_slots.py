"""Rollout buffers: one block per field, shared across processes, slot protocol."""

import multiprocessing as mp
import subprocess
import sys

import numpy as np
import pytest
import torch

from beast.algos.policies import CategoricalPolicy
from beast.experience.rollout_slots import RolloutBuffers, rollout_spec
from beast.fields import box_obs, core_state, core_state_key, shared_zeros


def make_buffers(num_buffers=6, unroll_length=3, core_state_shapes=((1, 5), (1, 5))):
    spec = rollout_spec(
        unroll_length=unroll_length,
        obs=box_obs((2, 3), np.uint8),
        record=CategoricalPolicy(4).record_spec(),
        core_state_shapes=core_state_shapes,
    )
    return RolloutBuffers(spec, num_buffers)


def test_one_contiguous_block_per_field():
    buffers = make_buffers()
    assert buffers.tensors["obs"].shape == (6, 4, 2, 3)
    assert buffers.tensors["obs"].dtype == torch.uint8
    assert buffers.tensors["policy_logits"].shape == (6, 4, 4)
    # Both episode-end flags travel with every step (beast/envs/batch.py).
    assert buffers.tensors["terminated"].shape == buffers.tensors["truncated"].shape == (6, 4)
    assert buffers.tensors[core_state_key(1)].shape == (6, 1, 5)
    for tensor in buffers.tensors.values():
        assert tensor.is_shared() and tensor.is_contiguous()
    assert buffers.free_queue.qsize() == 6 and buffers.full_queue.qsize() == 0


def _write_rollouts(buffers, count):
    """Child process: fill `count` slots with values derived from the slot index."""
    for _ in range(count):
        index = buffers.free_queue.get(timeout=10)
        buffers.tensors["obs"][index] = index
        buffers.tensors["reward"][index] = torch.arange(4) + 10.0 * index
        buffers.tensors[core_state_key(0)][index] = -index
        buffers.full_queue.put(index)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_written_in_one_process_read_in_another(method):
    buffers = make_buffers()
    ctx = mp.get_context(method)
    child = ctx.Process(target=_write_rollouts, args=(buffers, 4))
    child.start()
    indices = [buffers.full_queue.get(timeout=30) for _ in range(4)]
    child.join(10)
    assert child.exitcode == 0
    batch = buffers.gather(indices)
    # Time-major: [T+1, B, ...]; state: [d0, B, ...].
    assert batch["obs"].shape == (4, 4, 2, 3)
    assert batch["reward"].shape == (4, 4)
    for b, index in enumerate(indices):
        assert torch.all(batch["obs"][:, b] == index)
        assert torch.equal(batch["reward"][:, b], torch.arange(4) + 10.0 * index)
    state = core_state(batch)
    assert len(state) == 2 and state[0].shape == (1, 4, 5)
    assert torch.equal(state[0][0, :, 0], -torch.tensor(indices, dtype=torch.float32))


def test_gather_copies_out_of_the_slots():
    buffers = make_buffers()
    buffers.tensors["reward"][2] = 1.0
    batch = buffers.gather([2])
    buffers.tensors["reward"][2] = 7.0  # an actor reusing the slot
    assert torch.all(batch["reward"] == 1.0)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.bool, torch.float32, torch.int64])
def test_shared_zeros_are_zero_shared_and_shaped(dtype):
    tensor = shared_zeros((3, 0, 2), dtype)
    assert tensor.shape == (3, 0, 2) and tensor.dtype == dtype and tensor.is_shared()
    tensor = shared_zeros((5, 7), dtype)
    assert tensor.shape == (5, 7) and tensor.is_contiguous() and tensor.is_shared()
    assert not tensor.any()


def test_shared_zeros_do_not_touch_their_pages_until_written():
    """A 1 GiB block raises the process's peak resident memory by almost nothing (zeros
    then share_memory_() needed 2 GiB at the peak: private zeros, then the copy)."""
    code = (
        "import torch\n"
        "from beast.experience.rollout_slots import shared_zeros\n"
        "def peak_mib():\n"
        "    status = open('/proc/self/status').read()\n"
        "    return int(status.split('VmHWM:')[1].split()[0]) // 1024\n"
        "before = peak_mib()\n"
        "block = shared_zeros((1024, 1024, 1024), torch.uint8)\n"
        "block[0] = 1  # 1 MiB written: only the pages written take memory\n"
        "print(peak_mib() - before)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 64, f"peak resident memory grew by {out.stdout.strip()} MiB"


def test_synchronous_lanes_wait_for_the_update_their_rollouts_feed():
    """Synchronous rollouts (PPO, A2C): each writer lane owns its slots; after publishing
    a rollout a lane's next write waits until the learner releases the batch that holds
    it, while the other lane (the same actor's, stepping in turn) still publishes."""
    import os
    import threading

    from beast.experience.rollout_source import RolloutSource

    T = 3
    spec = rollout_spec(
        unroll_length=T,
        obs=box_obs((2,), np.float32),
        record=CategoricalPolicy(2).record_spec(),
    )
    buffers = RolloutBuffers(spec, num_buffers=2, num_lanes=2)
    source = RolloutSource(buffers, batch_size=2, device=torch.device("cpu"), synchronous=True)
    source.start()
    try:
        writers = []
        for lane in range(2):
            sources = {
                key: torch.zeros((1, *field.shape[1:]), dtype=field.dtype).numpy()
                for key, field in spec.items()
                if key != "rollout_id" and not key.startswith("core_state_")
            }
            writers.append(
                buffers.writer(
                    lane,
                    sources,
                    first_id=lane,
                    id_stride=2,
                    learner_pid=os.getpid(),
                    lane=lane,
                )
            )
        for _ in range(T + 1):  # both lanes, in turn: one whole rollout each
            for writer in writers:
                assert writer.write(())
        batch = source.next(timeout=5)
        assert batch is not None and sorted(batch.data["rollout_id"][0].tolist()) == [0, 1]

        wrote = threading.Event()
        thread = threading.Thread(target=lambda: wrote.set() if writers[0].write(()) else None)
        thread.start()
        assert not wrote.wait(0.5), "a lane took a slot before its rollout's update was out"
        source.release(batch)
        assert wrote.wait(5), "the lane did not get its slot back after the release"
        thread.join(5)
    finally:
        source.stop(5)
