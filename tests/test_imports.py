"""Light imports: `import bertflow` and `bertflow --help` load no torch, transformers or scikit-learn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
HEAVY = ("torch", "transformers", "sklearn", "scipy")


def loaded_after(code: str) -> dict[str, bool]:
    """Which heavy modules a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))"
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_bertflow_is_light():
    assert loaded_after("import bertflow; bertflow.__version__") == dict.fromkeys(HEAVY, False)


def test_cli_help_is_light():
    code = (
        "from bertflow.cli import app\n"
        "from typer.testing import CliRunner\n"
        "r = CliRunner().invoke(app, ['--help'])\n"
        "assert r.exit_code == 0 and 'fit' in r.output, r.output\n"
        "r = CliRunner().invoke(app, ['fit', '--help'])\n"
        "assert r.exit_code == 0 and 'auto' in r.output, r.output\n"
    )
    assert loaded_after(code) == dict.fromkeys(HEAVY, False)


def test_names_load_on_first_use():
    import bertflow
    from bertflow import calibrators

    assert bertflow.Embedder.__name__ == "Embedder"
    assert calibrators.AutoCalibrator.__name__ == "AutoCalibrator"
    assert set(bertflow.__all__) <= set(dir(bertflow))


def test_the_registry_finds_every_builtin_calibrator_in_a_fresh_process():
    listing = (
        "from bertflow.calibrators import calibrator_names, calibrator_specs\n"
        "assert {'auto', 'anchored', 'chain', 'whitening'} <= set(calibrator_names())\n"
        "assert 'whitening-K' in calibrator_specs()\n"
    )
    assert loaded_after(listing) == dict.fromkeys(HEAVY, False)  # read from the sources: no calibrator imported
    code = listing + "from bertflow.calibrators import get_calibrator_class\n"
    code += "assert get_calibrator_class('flow').__name__ == 'FlowCalibrator'\n"
    assert loaded_after(code)["torch"]  # ran, and loading the flow did need torch


def test_embedder_does_not_import_mteb_or_sentence_transformers():
    """The MTEB and sentence-transformers bridges are separate modules taking an Embedder, so
    bertflow works without either installed."""
    code = (
        "import sys\nimport bertflow.embedder\nfrom bertflow import Embedder\n"
        "assert Embedder.encode and Embedder.similarity\n"
        "bad = [m for m in ('mteb', 'sentence_transformers', 'datasets') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def test_no_module_imports_another_modules_private_names():
    """The layers talk through public names only (issue 15): no ``from .x import _name`` across modules."""
    import ast

    root = Path(SRC) / "bertflow"
    offenders = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("bertflow")):
                offenders += [
                    f"{path.relative_to(root)}: {a.name} from {node.module}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                ]
    assert offenders == []


# -- the layers: no import circle, no upward import ------------------------------------------------------------

#: Each module's floor, top first (docs/architecture.md, "The layers"). A module imports only floors below its own,
#: or modules of its own group on its floor (the product modules import one another; the package groups of one
#: floor never do). Anything not named here is a product module (``bertflow.<name>``, floor 4).
FLOORS: dict[str, tuple[int, str]] = {
    "bertflow": (8, "package"),
    "bertflow.__main__": (8, "package"),
    "bertflow.cli": (7, "cli"),
    "bertflow.paper": (6, "paper"),
    "bertflow.integrations": (5, "integrations"),
    "bertflow.scale": (5, "scale"),
    "bertflow.evaluation": (5, "evaluation"),
    "bertflow.encoding": (3, "encoding"),
    "bertflow.calibrators": (3, "calibrators"),
    "bertflow.io": (2, "io"),
    "bertflow.flows": (2, "flows"),
    "bertflow.validation": (1, "base"),
    "bertflow.linalg": (1, "base"),
    "bertflow.resources": (1, "base"),
    "bertflow.cuda_graphs": (1, "base"),
    "bertflow.typing": (1, "base"),
    "bertflow.errors": (0, "errors"),
    "bertflow._version": (0, "errors"),
}


def floor_of(module: str) -> tuple[int, str]:
    """(floor, group) of a module: its longest prefix in :data:`FLOORS`, else a product module."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        found = FLOORS.get(".".join(parts[:n]))
        if found is not None and (n > 1 or module == "bertflow"):
            return found
    return (4, "product")


def package_imports() -> dict[str, set[str]]:
    """Every bertflow module -> the bertflow modules it imports, at module level AND inside functions (imports
    under ``if TYPE_CHECKING:`` are not run, so not counted). ``from . import name`` counts the submodule ``name``
    where there is one, else the package."""
    import ast

    root = Path(SRC) / "bertflow"
    files = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts[:-1]) if rel.name == "__init__" else list(rel.parts)
        files[".".join(parts)] = (path, rel.name == "__init__")
    modules = set(files)

    def skip_type_checking(tree: ast.AST) -> list[ast.AST]:
        nodes, stack = [], [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                stack.extend(node.orelse)
                continue
            nodes.append(node)
            stack.extend(ast.iter_child_nodes(node))
        return nodes

    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in files.items():
        package = module if is_package else module.rpartition(".")[0]
        targets = set()
        for node in skip_type_checking(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names if a.name.split(".")[0] == "bertflow"}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                elif (node.module or "").split(".")[0] == "bertflow":
                    target = node.module
                else:
                    continue
                subs = {f"{target}.{a.name}" for a in node.names} & modules
                targets |= subs or {target}
        resolved = set()
        for target in targets:
            while target not in modules and "." in target:  # a name inside a module: the module
                target = target.rpartition(".")[0]
            if target != module:
                resolved.add(target)
        graph[module] = resolved
    return graph


def test_no_import_circle_not_even_through_a_function_level_import():
    graph = package_imports()
    # Tarjan's strongly connected components: any component of more than one module is a circle.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    import sys

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert circles == []


def test_no_upward_import():
    """No module imports a floor above its own, nor another group of its own floor (encoding <-> calibrators,
    integrations / scale / evaluation), at module level or inside a function."""
    upward = []
    for module, targets in package_imports().items():
        floor, group = floor_of(module)
        for target in targets:
            their_floor, their_group = floor_of(target)
            if their_floor > floor or (their_floor == floor and their_group != group):
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_the_import_walk_sees_function_level_imports():
    """The walk is not blind: this very rule flags an upward import hidden inside a function."""
    graph = package_imports()
    assert "bertflow.encoding.encoder" in graph["bertflow.model_folder"]  # module level
    assert "bertflow.calibrators.device" in graph["bertflow.embedder"]  # inside device_transform()
    assert floor_of("bertflow.scale.encode") > floor_of("bertflow.embedder") > floor_of("bertflow.encoding.loading")


def test_the_format_modules_are_light():
    """Stores, indexes and the CLI's early checks import these without loading torch or scikit-learn."""
    code = "import bertflow.typing, bertflow.hub, bertflow.io.formats"
    assert loaded_after(code) == dict.fromkeys(HEAVY, False)
