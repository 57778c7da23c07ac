"""The package's layers, kept: no module imports from a higher layer, no import cycle (imports
inside functions included), only :mod:`lightning_memplan._torch` names private torch modules, and
the pure layers import with torch absent."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "lightning_memplan"

#: Lowest first. A module may import its own layer and those below; packages are named by their
#: top folder, single modules by their name.
LAYERS: list[set[str]] = [
    {"units", "plan", "text", "_native_io", "targets"},
    {"solvers", "placement"},
    {"core"},
    {"_torch"},
    {"measure", "report"},
    {"forecasting"},
    {"planner"},
    {"callback"},
    {"tuner"},
    {"cli", "demo", "bench"},
]
#: Packages that must import with torch absent.
PURE = ["lightning_memplan.units", "lightning_memplan.targets", "lightning_memplan.text", "lightning_memplan.plan", "lightning_memplan.solvers",
        "lightning_memplan.placement", "lightning_memplan.core", "lightning_memplan.core.simulate",
        "lightning_memplan.core.remat", "lightning_memplan.core.cuda_allocator", "lightning_memplan.core.front",
        "lightning_memplan.core.peaks", "lightning_memplan.core.instance_patch"]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The package modules ``path`` imports, anywhere in it (functions included, ``TYPE_CHECKING``
    blocks excluded), resolved to the module (``from pkg import mod`` names the submodule)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)} - {id(node.test)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import (the package uses absolute imports)")
            mod = node.module or ""
            for alias in node.names:
                sub = f"{mod}.{alias.name}"
                found.add(sub if sub in known else mod)
    return {m for m in found if m == "lightning_memplan" or m.startswith("lightning_memplan.")}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else ""
    for rank, names in enumerate(LAYERS):
        if top in names:
            return rank
    raise AssertionError(f"{module}: not in any layer of tests/test_layering.py (add it)")


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {m: {i for i in _imports(p, known) if i != m} for m, p in mods.items()}


def test_every_module_is_in_a_layer_and_imports_none_above_it() -> None:
    graph = _graph()
    upward = sorted(f"{m} -> {i}" for m, deps in graph.items() if m != "lightning_memplan"
                    for i in deps if i != "lightning_memplan" and _layer(i) > _layer(m))
    assert upward == [], upward


def test_no_module_imports_the_package_root() -> None:
    """The root ``lightning_memplan`` re-exports the top; a module importing it would hide a cycle."""
    graph = _graph()
    assert sorted(m for m, deps in graph.items() if "lightning_memplan" in deps) == []


def test_there_is_no_import_cycle() -> None:
    graph = _graph()
    # package __init__ files count as importing nothing (they re-export lazily or their own members)
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == [], cycles


def test_only_the_torch_layer_names_private_torch_modules() -> None:
    offenders = []
    for module, path in _modules().items():
        if module.startswith("lightning_memplan._torch"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Attribute):
                names = [ast.unparse(node)]
            for name in names:
                if name.startswith("torch.") and any(p.startswith("_") for p in name.split(".")[1:]):
                    offenders.append(f"{module}: {name}")
                    break
    assert sorted(set(offenders)) == [], sorted(set(offenders))


def test_the_pure_layers_import_without_torch() -> None:
    code = (
        "import sys\n"
        "class _NoTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'):\n"
        "            raise ImportError('torch is made unimportable for this test')\n"
        "sys.meta_path.insert(0, _NoTorch())\n"
        "import importlib\n"
        f"for m in {PURE!r}:\n"
        "    importlib.import_module(m)\n"
        "assert not any(k == 'torch' or k.startswith('torch.') for k in sys.modules), 'torch got imported'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]





def test_no_module_is_over_600_lines() -> None:
    long = {m for m, p in _modules().items() if len(p.read_text().splitlines()) > 600}
    assert long == set()


def test_the_package_root_holds_few_modules() -> None:
    assert len([p for p in PKG.glob("*.py")]) <= 12
