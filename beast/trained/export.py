"""`beast.export(run, format)` and `python -m beast.export RUN_DIR --format torchscript|onnx`
(beast/export.py, the command line): a run's acting policy as a file that runs without
beast (docs/export.md).

    python -m beast.export ~/logs/beast/pong --format onnx            # RUN_DIR/policy.onnx
    python -m beast.export ~/logs/beast/pong --format torchscript --checkpoint best -o p.pt

The file holds `beast.trained.policy.ActingModule`: the policy `--mode test` plays, one step for
a batch of envs, with its inputs and outputs named and ordered as beast/trained/policy.py's
module docstring says, and that signature as JSON: the extra file "beast.json" of a
TorchScript archive (`torch.jit.load(path, _extra_files={"beast.json": ""})`), the
metadata entry "beast" of an ONNX model (onnxruntime's
`session.get_modelmeta().custom_metadata_map["beast"]`). TorchScript is traced,
ONNX goes through torch.onnx's dynamo exporter (opset 18, onnxscript); both take any
batch size. `beast.load_policy(file)` runs either behind the same `Policy.act`.

ONNX needs the `export` extra (`pip install -e '.[export]'`: onnx, onnxruntime,
onnxscript). Bad input (no such run or checkpoint, an unknown format, a missing package)
is one line and exit 2.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from beast.config import ConfigError
from beast.envs import EnvError
from beast.trained.policy import (
    Policy,
    Signature,
    StepFunction,
    acting_module,
    example_inputs,
    torch_step,
)

__all__ = ["FORMATS", "export", "load_exported", "load_policy", "main"]

# Format -> the default file name's extension.
FORMATS = {"torchscript": "pt", "onnx": "onnx"}
# Where the signature travels: a TorchScript extra file, an ONNX metadata key.
SIGNATURE_FILE = "beast.json"
SIGNATURE_KEY = "beast"
_ONNX_PACKAGES = "pip install -e '.[export]' (onnx, onnxruntime, onnxscript)"
# The logger of torch's registry of ONNX functions, which it builds on a process's first
# export: it warns of ops of packages that are not installed ("torchvision is not
# installed. Skipping torchvision::nms", four lines) and of its own naming quirks, none of
# them about the policy exported (an op that cannot be exported raises).
_ONNX_REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"


def _require_onnx() -> None:
    for package in ("onnx", "onnxruntime", "onnxscript"):
        try:
            __import__(package)
        except ImportError:
            raise ConfigError(f"ONNX export needs {package}: {_ONNX_PACKAGES}") from None


def export(
    run: Any,
    format: str = "torchscript",
    *,
    checkpoint: str = "latest",
    output: str | os.PathLike | None = None,
) -> str:
    """Write the acting policy of a run to a file; returns its path.

    Args:
        run: the run directory (or `beast.train`'s result).
        format: torchscript or onnx.
        checkpoint: latest (model.tar) or best (model_best.tar, --eval_interval runs).
        output: the file; by default RUN_DIR/policy.pt or policy.onnx (policy_best.* for
            the best checkpoint).

    Raises:
        ConfigError: no such run or checkpoint, an unknown format, ONNX packages missing.
        EnvError: the run's env cannot be made (its spec is read from it).
    """
    if format not in FORMATS:
        raise ConfigError(f"unknown format {format!r}: use {' or '.join(FORMATS)}")
    if format == "onnx":
        _require_onnx()
    run_dir = os.path.abspath(os.path.expanduser(os.fspath(getattr(run, "run_dir", run))))
    module, signature = acting_module(run_dir, checkpoint)
    if output is None:
        suffix = "" if checkpoint == "latest" else f"_{checkpoint}"
        output = os.path.join(run_dir, f"policy{suffix}.{FORMATS[format]}")
    output = os.fspath(output)
    example = example_inputs(signature)
    # Tracing warns of the Python branches it records (an LSTM unroll's `T > 1`), which
    # are fixed for one step; the ONNX exporter of its deprecations and skipped ops.
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        try:
            if format == "torchscript":
                traced = torch.jit.trace(module, example, check_trace=False)
                extra = {SIGNATURE_FILE: signature.to_json()}
                torch.jit.save(traced, output, _extra_files=extra)
            else:
                _export_onnx(module, example, signature, output)
        # A user's network or policy that cannot be traced, or the exporter's many error
        # types: one line, the cause chained for a debugger.
        except Exception as error:
            reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise ConfigError(
                f"cannot export {run_dir} to {format}: {reason or type(error).__name__}"
            ) from error
    return output


def _export_onnx(
    module: torch.nn.Module, example: tuple[Tensor, ...], signature: Signature, output: str
) -> None:
    batch = torch.export.Dim("batch")
    registry = logging.getLogger(_ONNX_REGISTRY_LOGGER)
    level = registry.level
    registry.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # the exporter reports its steps
            program = torch.onnx.export(
                module,
                example,
                input_names=[s.name for s in signature.inputs],
                output_names=[s.name for s in signature.outputs],
                # forward(*inputs): one entry for the tuple, the batch axis of each input.
                dynamic_shapes=(tuple({0: batch} for _ in example),),
                dynamo=True,
                verbose=False,
            )
    finally:
        registry.setLevel(level)
    program.model.metadata_props[SIGNATURE_KEY] = signature.to_json()
    program.save(output)


def load_exported(path: str) -> Policy:
    """`beast.load_policy` of a file `export` wrote: a TorchScript archive (a zip) with
    torch.jit, anything else as ONNX with onnxruntime."""
    if zipfile.is_zipfile(path):
        extra = {SIGNATURE_FILE: ""}
        try:
            with warnings.catch_warnings():  # torch 2.13 deprecates TorchScript (module doc)
                warnings.simplefilter("ignore", DeprecationWarning)
                module = torch.jit.load(path, _extra_files=extra)
        except RuntimeError as error:
            raise ConfigError(f"{path} is no TorchScript file beast exported: {error}") from None
        if not extra[SIGNATURE_FILE]:
            raise ConfigError(f"{path} holds no beast policy signature ({SIGNATURE_FILE})")
        return Policy(torch_step(module), Signature.from_json(extra[SIGNATURE_FILE]))
    try:
        import onnxruntime
    except ImportError:
        raise ConfigError(
            f"{path} is an ONNX file, which needs onnxruntime: {_ONNX_PACKAGES}"
        ) from None
    try:
        session = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own exception types
        raise ConfigError(f"{path} is no ONNX model: {str(error).splitlines()[0]}") from None
    metadata = session.get_modelmeta().custom_metadata_map
    if SIGNATURE_KEY not in metadata:
        raise ConfigError(f"{path} holds no beast policy signature (metadata {SIGNATURE_KEY!r})")
    signature = Signature.from_json(metadata[SIGNATURE_KEY])
    return Policy(_onnx_step(session, signature), signature)


def load_policy(run: Any, *, checkpoint: str = "latest") -> Policy:
    """The acting policy of a run or of an exported file, to call from Python.

    Args:
        run: a run directory (or `beast.train`'s result): the policy --mode test plays,
            built from its checkpoint; or a file `beast.export` wrote (TorchScript .pt,
            or ONNX .onnx, run with onnxruntime).
        checkpoint: latest or best, for a run directory.

    Raises:
        ConfigError: no such run, checkpoint or file; onnxruntime missing for an .onnx.
    """
    run_dir = getattr(run, "run_dir", run)
    path = os.path.abspath(os.path.expanduser(os.fspath(run_dir)))
    if os.path.isfile(path):
        return load_exported(path)
    module, signature = acting_module(path, checkpoint)
    return Policy(torch_step(module), signature)


def _onnx_step(session: Any, signature: Signature) -> StepFunction:
    """onnxruntime over torch tensors. The exporter drops inputs the network never reads
    (`done` of a feed-forward one), so only the graph's own are fed."""
    used = {node.name for node in session.get_inputs()}
    names = [s.name for s in signature.inputs]

    def step(inputs: Sequence[Tensor]) -> Sequence[Tensor]:
        feed = {
            name: value.numpy() for name, value in zip(names, inputs, strict=True) if name in used
        }
        return [torch.from_numpy(value) for value in session.run(None, feed)]

    return step


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m beast.export",
        description="Write a run's acting policy (as --mode test plays it) to a TorchScript"
        " or ONNX file that runs without beast (docs/export.md).",
    )
    parser.add_argument("run_dir", help="the run's directory, SAVEDIR/XPID")
    parser.add_argument("--format", required=True, help="torchscript or onnx")
    parser.add_argument(
        "--checkpoint", default="latest", help="latest (model.tar) or best (model_best.tar)"
    )
    parser.add_argument(
        "-o", "--output", default=None, help="the file (default: RUN_DIR/policy.pt or .onnx)"
    )
    args = parser.parse_args(argv)
    try:
        path = export(args.run_dir, args.format, checkpoint=args.checkpoint, output=args.output)
    except (ConfigError, EnvError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    print(f"[beast] wrote {path}", flush=True)
    return 0
