"""The learning tests' fixtures: `fast_backend` for the compiled steps' parity tests."""

import pytest

from beast.train_step import auto, compiler


@pytest.fixture
def fast_backend(monkeypatch):
    """torch's aot_eager backend: the step's traced graph run by eager kernels, seconds
    where inductor's C++ takes a minute cold on 2 cores (tests/learning/test_train_step.py)."""
    monkeypatch.setattr(compiler, "BACKEND", "aot_eager")
    # Compile after two eager steps of a kind (the first times nothing), not four.
    monkeypatch.setattr(auto, "EAGER_PROBES", 2)
