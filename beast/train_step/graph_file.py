"""A traced step's graph as bytes a build's child reads (beast/train_step/package.py).

A package used to be built from an ExportedProgram: the trace exported again
(`torch.export.export`, a second trace of the whole graph), saved and loaded in the
child. On the 2-core VM that was 9 CPU seconds of a SAC Pendulum block's build: export
3.4, save 2.0, the child's load 3.5 (2026-12-07, benchmarks/RESULTS.md), and the export
patched torch.nn.Module for the whole process while it ran. inductor's compiler takes
the trace itself (`torch._inductor.aot_compile` of a GraphModule), so the graph goes to
the child as its nodes, written here in 0.02 s and read in 0.04.

The trace is operator-level (make_fx): each node's target is an operator overload
(`torch.ops.aten.mm.default`), named by its schema, or a plain Python function (the
`getitem` of an operator's tuple output), named by module and qualified name; its
arguments are nodes, Python values, devices, and torch's named constants (dtypes,
memory formats, layouts), written as `torch.<name>`. A graph with anything else raises
`Unwritable`, and the build takes the export's way.

torch's own pickling of those constants names no module (a dtype reduces to "float32",
a memory format to "torch.preserve_format"), so pickle searches `sys.modules` for one
that holds the object, and takes the first. `import multiprocessing` registers the main
module as `__mp_main__`, which pickle does not skip; a script that imports
multiprocessing before torch (isort's order) and holds `torch` itself had
`torch.preserve_format` written as `__mp_main__`'s, and the child, whose main module
is another, failed to read it: every build of such a script's steps failed, and its
learner stayed eager (`python -m benchmarks.learner_step` timed eager as compiled).
Layouts do not pickle at all.
"""

from __future__ import annotations

import importlib
import io
import pickle
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, treespec_dumps, treespec_loads

__all__ = ["Unwritable", "dumps", "loads"]

# Bumped when what the bytes hold changes.
_FORMAT = 1


class Unwritable(Exception):
    """A graph holds a node this module does not write (the export's way then)."""


class _Node:
    """A reference to an earlier node, by name, in the written arguments."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __reduce__(self) -> tuple[Any, ...]:
        return (_Node, (self.name,))


def dumps(graph: torch.fx.GraphModule, arguments: tuple[Any, ...]) -> bytes:
    """`graph` (make_fx's, called as `graph(*arguments)`) and `arguments` as bytes: its
    nodes, the constants its `get_attr` nodes read, the call's input structure as inductor
    flattens it (`(arguments, {})`) and its output structure."""
    codegen = graph.graph._codegen
    out_spec = getattr(getattr(codegen, "pytree_info", None), "out_spec", None)
    if out_spec is None:  # flat arguments (make_fx then writes no structure): a flat tuple
        output = next(node for node in reversed(graph.graph.nodes) if node.op == "output")
        result = output.args[0]
        if not isinstance(result, tuple | list) or any(
            isinstance(item, tuple | list | dict) for item in result
        ):
            raise Unwritable("an output of no written structure")
        out_spec = tree_flatten(tuple(result))[1]
    nodes, constants = [], {}
    for node in graph.graph.nodes:
        target = node.target
        if node.op == "call_function":
            target = _target_name(target)
        elif node.op == "get_attr":
            constants[target] = getattr(graph, target)
        elif node.op not in ("placeholder", "output"):
            raise Unwritable(f"a {node.op} node")
        refer = _refer
        nodes.append(
            (
                node.op,
                node.name,
                target,
                torch.fx.node.map_aggregate(node.args, refer),
                torch.fx.node.map_aggregate(node.kwargs, refer),
            )
        )
    in_spec = treespec_dumps(tree_flatten((arguments, {}))[1])
    written = io.BytesIO()
    try:
        _Pickler(written).dump(
            (_FORMAT, nodes, constants, in_spec, treespec_dumps(out_spec), arguments)
        )
    except (pickle.PicklingError, TypeError, AttributeError) as error:
        raise Unwritable(str(error)) from error
    return written.getvalue()


def loads(data: bytes) -> tuple[torch.fx.GraphModule, tuple[Any, ...]]:
    """The graph `dumps` wrote, as a GraphModule of flat inputs whose `_in_spec` and
    `_out_spec` say the call's structure (what `torch._inductor.aot_compile` reads), and
    the arguments."""
    version, nodes, constants, in_spec, out_spec, arguments = pickle.loads(data)
    if version != _FORMAT:
        raise ValueError(f"a graph file of format {version}, not {_FORMAT}")
    graph = torch.fx.Graph()
    made: dict[str, torch.fx.Node] = {}

    def node_of(value: Any) -> Any:
        return made[value.name] if isinstance(value, _Node) else value

    for op, name, target, args, kwargs in nodes:
        if op == "call_function":
            target = _target(target)
        args = torch.fx.node.map_aggregate(args, node_of)
        kwargs = torch.fx.node.map_aggregate(kwargs, node_of)
        made[name] = graph.create_node(op, target, args, kwargs, name)
    root = torch.nn.Module()
    for name, value in constants.items():
        setattr(root, name, value)
    module = torch.fx.GraphModule(root, graph)
    module._in_spec = treespec_loads(in_spec)
    module._out_spec = treespec_loads(out_spec)
    return module, arguments


_NAMED_CONSTANTS = (torch.dtype, torch.memory_format, torch.layout, torch.qscheme)


class _Pickler(pickle.Pickler):
    """pickle, with torch's named constants written as `torch.<name>` (the module's
    docstring says why)."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)

    def reducer_override(self, obj: Any) -> Any:
        if not isinstance(obj, _NAMED_CONSTANTS):
            return NotImplemented
        name = str(obj).removeprefix("torch.")
        if getattr(torch, name, None) is not obj:
            raise Unwritable(f"the constant {obj!r}")
        return (_torch_constant, (name,))


def _torch_constant(name: str) -> Any:
    """`torch.<name>`, for a written constant (`_Pickler`)."""
    return getattr(torch, name)


def _refer(value: Any) -> Any:
    return _Node(value.name) if isinstance(value, torch.fx.Node) else value


def _target_name(target: Any) -> tuple[str, str, str]:
    """("op", schema name, overload) for an operator overload, ("py", module, qualified
    name) for a plain function."""
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target._schema.name, target._overloadname)
    module, name = getattr(target, "__module__", None), getattr(target, "__qualname__", None)
    if not (module and name) or "<" in name or _resolve(module, name) is not target:
        raise Unwritable(f"the node target {target!r}")
    return ("py", module, name)


def _target(name: tuple[str, str, str]) -> Any:
    kind, first, second = name
    if kind == "op":
        namespace, operator = first.split("::")
        return getattr(getattr(getattr(torch.ops, namespace), operator), second or "default")
    return _resolve(first, second)


def _resolve(module: str, name: str) -> Any:
    try:
        value: Any = importlib.import_module(module)
        for part in name.split("."):
            value = getattr(value, part)
    except (ImportError, AttributeError):
        return None
    return value
