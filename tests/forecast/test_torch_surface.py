"""The surface of :mod:`lightning_memplan._torch`: each module's ``__all__`` is accurate. Every name
in it exists and is defined or imported there, every name another module takes from it is listed,
and every listed name is taken by another module (package, tests, benchmarks, examples)."""
from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
TORCH_DIR = ROOT / "lightning_memplan" / "_torch"
PREFIX = "lightning_memplan._torch"
#: The ``_torch`` modules by their short name (``storages``), ``__init__`` left out.
MODULES = sorted(p.stem for p in TORCH_DIR.glob("*.py") if p.stem != "__init__")
#: Where the names are used.
SOURCES = [ROOT / "lightning_memplan", ROOT / "tests", ROOT / "benchmarks", ROOT / "examples"]


def _declared_all(path: Path) -> list[str]:
    """The literal ``__all__`` of ``path`` (a module without one fails)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError(f"{path.name}: no literal __all__")


def _top_level_names(path: Path) -> set[str]:
    """Names bound at the top level of ``path``: functions, classes, assignments, imports."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _uses(path: Path) -> Iterator[tuple[str, str]]:
    """``(module, name)`` for each name ``path`` takes from a ``_torch`` module: ``from
    lightning_memplan._torch.m import name``, or ``alias.name`` where ``alias`` is the module
    (``from lightning_memplan._torch import m as alias``, ``import lightning_memplan._torch.m as alias``)."""
    tree = ast.parse(path.read_text())
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX + "."):
            for a in node.names:
                yield node.module.removeprefix(PREFIX + "."), a.name
        elif isinstance(node, ast.ImportFrom) and node.module == PREFIX:
            aliases |= {a.asname or a.name: a.name for a in node.names if a.name in MODULES}
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith(PREFIX + "."):
                    aliases[a.asname or a.name] = a.name.removeprefix(PREFIX + ".")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = ast.unparse(node.value)
            if owner in aliases:
                yield aliases[owner], node.attr


def _uses_by_module() -> dict[str, set[str]]:
    """The names other files take from each ``_torch`` module (a module's own file left out)."""
    used: dict[str, set[str]] = {m: set() for m in MODULES}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            for module, name in _uses(path):
                if module in used and path != TORCH_DIR / f"{module}.py":
                    used[module].add(name)
    return used


def test_the_torch_layer_has_modules_and_the_uses_are_found() -> None:
    # guards the tests below against scanning nothing
    assert {"version", "storages", "partitioner", "inductor", "fsdp"} <= set(MODULES)
    assert "storage_key" in _uses_by_module()["storages"]


@pytest.mark.parametrize("module", MODULES)
def test_every_listed_name_exists_and_is_defined_or_imported_there(module: str) -> None:
    path = TORCH_DIR / f"{module}.py"
    declared = _declared_all(path)
    assert declared, f"{module}: empty __all__"
    assert len(declared) == len(set(declared)), f"{module}: __all__ lists a name twice"
    mod = importlib.import_module(f"{PREFIX}.{module}")
    assert list(mod.__all__) == declared
    assert [n for n in declared if not hasattr(mod, n)] == []
    assert sorted(set(declared) - _top_level_names(path)) == []


def test_other_modules_take_only_listed_names() -> None:
    used = _uses_by_module()
    unlisted = sorted(f"{m}.{n}" for m in MODULES for n in used[m] - set(_declared_all(TORCH_DIR / f"{m}.py")))
    assert unlisted == [], f"taken from a _torch module but not in its __all__: {unlisted}"


def test_every_listed_name_is_taken_by_another_module() -> None:
    used = _uses_by_module()
    unused = sorted(f"{m}.{n}" for m in MODULES for n in set(_declared_all(TORCH_DIR / f"{m}.py")) - used[m])
    assert unused == [], f"in a _torch module's __all__ but used nowhere else: {unused}"


def test_tree_leaves_traces_into_one_graph() -> None:
    """A default loss inside the compiled function flattens the outputs with ``tree_leaves``: an
    import at call time there made dynamo break the graph (two regions instead of one, and the
    Lightning-step forecast 36% high on a model with a frozen stem)."""
    import torch

    from lightning_memplan._torch.storages import tree_leaves

    def loss(x: torch.Tensor) -> torch.Tensor:
        return sum(t.sum() for t in tree_leaves({"a": x * 2, "b": (x + 1, x.relu())}))

    compiled = torch.compile(loss, backend="eager", fullgraph=True)  # a graph break raises
    x = torch.randn(4)
    assert torch.allclose(compiled(x), loss(x))


def test_random_ops_are_never_recomputed_under_a_budget() -> None:
    """Dropout decomposed is ``aten.rand``; under a budget below 1 torch's knapsack recomputes it in the
    backward (new numbers: another mask). Within ``random_ops_saved`` the backward draws nothing, and
    the compiled step's gradients are those of the same step run eagerly with the same seed."""
    from functorch.compile import min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    from lightning_memplan._torch.partitioner import random_ops_saved

    drawn: dict[str, int] = {}

    def counting(tag: str):  # type: ignore[no-untyped-def]
        def compiler(gm, example_inputs):  # type: ignore[no-untyped-def]
            drawn[tag] = sum(torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
                             for n in gm.graph.nodes if n.op == "call_function")
            return gm
        return compiler

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Dropout(0.3),
                              torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Dropout(0.3),
                              torch.nn.Linear(256, 1))
    x = torch.randn(32, 64)
    backend = aot_autograd(fw_compiler=counting("fw"), bw_compiler=counting("bw"),
                           partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    with torch._functorch.config.patch(activation_memory_budget=0.05), random_ops_saved():
        torch.manual_seed(1)
        torch.compile(net, backend=backend, dynamic=False)(x).sum().backward()
    assert drawn["fw"] >= 2 and drawn["bw"] == 0
    compiled = [p.grad.clone() for p in net.parameters()]
    net.zero_grad(set_to_none=True)
    torch.manual_seed(1)
    torch.compile(net, backend="aot_eager_decomp_partition", dynamic=False)(x).sum().backward()  # budget 1: saved
    assert all(torch.allclose(a, p.grad, atol=1e-6) for a, p in zip(compiled, net.parameters()))
