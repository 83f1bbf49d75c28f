"""beast.compile.CompiledForward: a compilation failure is logged once, then eager."""

import torch

from beast import compile as beast_compile


class Doubler(torch.nn.Module):
    def forward(self, x):
        return 2 * x


def test_a_failed_compilation_falls_back_to_the_eager_model(monkeypatch):
    def broken_compile(model):
        def compiled(*args):
            raise RuntimeError("no C++ compiler found\nmore detail")

        return compiled

    monkeypatch.setattr(beast_compile.torch, "compile", broken_compile)
    logged = []
    forward = beast_compile.CompiledForward(Doubler(), logged.append)
    assert forward.compiled
    x = torch.arange(3.0)
    assert torch.equal(forward(x), 2 * x)
    assert torch.equal(forward(x), 2 * x)
    assert not forward.compiled
    assert len(logged) == 1
    assert "RuntimeError: no C++ compiler found" in logged[0] and "uncompiled" in logged[0]


def test_an_error_of_the_model_itself_still_raises(monkeypatch):
    monkeypatch.setattr(beast_compile.torch, "compile", lambda model: model)

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise ValueError("bad input")

    forward = beast_compile.CompiledForward(Broken(), lambda line: None)
    try:
        forward(torch.zeros(1))
    except ValueError as error:
        assert "bad input" in str(error)
    else:
        raise AssertionError("the model's own error was swallowed")
