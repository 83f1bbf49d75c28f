"""The suite's own isolation (tests/conftest.py): each pytest process has a private home
and compile cache, and a test's changes to torch's threads and seeds end with it."""

import os
import pwd
import random
import subprocess
import sys

import numpy as np
import torch

from beast.util.records import compile_cache_dir, read_record, write_record
from tests.support.global_state import global_state_kept


def test_home_and_compile_cache_are_this_processs_own():
    user_home = pwd.getpwuid(os.getuid()).pw_dir
    home = os.environ["HOME"]
    assert os.path.realpath(home) != os.path.realpath(user_home)
    assert os.path.expanduser("~") == home
    private = os.path.dirname(home)
    assert os.path.basename(private).startswith("beast-tests-")
    assert os.path.commonpath([compile_cache_dir(), private]) == private
    # A run's default --savedir (~/logs/beast) lies in the private home too.
    assert os.path.expanduser("~/logs/beast").startswith(home + os.sep)


def test_a_subprocess_reads_and_writes_the_same_private_records():
    code = (
        "from beast.util.records import compile_cache_dir, write_record;"
        "write_record('isolation.json', 'key', {'from': 'child'});"
        "print(compile_cache_dir())"
    )
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == compile_cache_dir()
    assert read_record("isolation.json", "key") == {"from": "child"}
    write_record("isolation.json", "key", {})  # leave the record as the child found it


def test_global_state_kept_restores_threads_and_every_random_state():
    threads = torch.get_num_threads()
    states = torch.random.get_rng_state(), np.random.get_state()[1].copy(), random.getstate()
    with global_state_kept():
        torch.set_num_threads(threads + 1)
        torch.manual_seed(123)
        np.random.seed(123)
        random.seed(123)
        torch.rand(5)
    assert torch.get_num_threads() == threads
    assert torch.equal(torch.random.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1])
    assert random.getstate() == states[2]
