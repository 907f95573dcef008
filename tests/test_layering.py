"""The floors hold: every import goes down (or stays on its floor), read from every import of every module.

Floors, bottom to top (a module's floor is its longest matching prefix):
recipecache → errors, envs, metrics, units, version → formats → settings, targets, timeline → runtime → lowering →
capture →
serve → backend → gaudi, device → modelfiles → shipping → diagnosis → planning → run → the hpu_backend package itself →
cli (hpurecipe).

The floors meet at the compile session (``hpu_backend.serve.session``): every front end hands its graphs to
one, so the session is the one place that runs the bucket passes (``lower_bucket``) outside the lowering
package, and nothing subscribes to a session's events when it is imported.

Each module's imports are parsed with ``ast`` (imports inside functions, and ``importlib.import_module``
of a literal name, included); a module may import its own floor or a lower one, never a higher one.
``recipecache`` and ``hpu_backend.formats`` import no torch, ``recipecache`` no hpu_backend, and a package
``__init__`` only re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> the import name of its package.
PACKAGES = {"cli/hpurecipe": "hpurecipe", "hpu_backend": "hpu_backend", "recipecache": "recipecache"}
# Bottom to top; the modules of one floor may import each other.
FLOORS = (
    ("recipecache",),
    ("hpu_backend.errors", "hpu_backend.envs", "hpu_backend.metrics", "hpu_backend.units", "hpu_backend.version"),
    ("hpu_backend.formats",),
    ("hpu_backend.settings", "hpu_backend.buckets", "hpu_backend.targets", "hpu_backend.timeline"),
    ("hpu_backend.runtime",),
    ("hpu_backend.lowering",),
    ("hpu_backend.capture",),
    ("hpu_backend.serve",),
    ("hpu_backend.backend",),
    ("hpu_backend.gaudi", "hpu_backend.device"),
    # The rooms by job, over the device: the model files every tool reads (a model.py, a Hugging Face config),
    # shipping (warm, packages, bundles, precompiled, fleet), diagnosis (analyze, advise, a step's memory),
    # planning (capacity, serving, training, which read what diagnosis measures).
    ("hpu_backend.modelfiles",),
    ("hpu_backend.shipping",),
    ("hpu_backend.diagnosis",),
    ("hpu_backend.planning",),
    ("hpu_backend.run",),  # the launcher: Intel's module names, ranks, the run's report
    ("hpu_backend",),
    ("hpurecipe",),
)
LAYERS = tuple(prefix for floor in FLOORS for prefix in floor)
FLOOR_OF = {prefix: i for i, floor in enumerate(FLOORS) for prefix in floor}
TORCH_FREE = ("recipecache", "hpu_backend.formats", "hpu_backend.errors", "hpu_backend.envs", "hpu_backend.version",
              "hpu_backend.timeline")
# Torch-free modules that may import torch inside one function, each with its reason.
TORCH_EXCEPTIONS = {
    "hpu_backend.formats.symexpr":
        "encode() walks sympy trees holding torch's sympy functions; decoding needs no torch",
}
# What a package __init__ may hold besides imports and its docstring: the names it exports, and the lazy
# loader of those names (so that importing the package stays cheap).
INIT_NAMES = {"__all__", "_EXPORTS", "__getattr__", "__dir__"}
# Known exceptions, each with its reason; the test fails when one no longer applies, so the list shrinks.
INIT_EXCEPTIONS: dict[str, str] = {}


def prefix_of(module: str) -> str | None:
    """The longest floor prefix a module of ours matches (hpu_backend.shipping over hpu_backend), None for others."""
    matches = [p for p in LAYERS if module == p or module.startswith(p + ".")]
    return max(matches, key=len) if matches else None


def layer_of(module: str) -> int | None:
    """The floor of a module of ours (0 = recipecache), None for anything else."""
    prefix = prefix_of(module)
    return None if prefix is None else FLOOR_OF[prefix]


def module_name(path: Path, folder: Path, package: str) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported module) for every import anywhere in the file, relative ones resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(package, node.level, node.module)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]  # a name may be a module
        elif _is_import_module(node):
            found.append((node.lineno, node.args[0].value))
    return found


def _resolve(package: str, level: int, name: str | None) -> str:
    if not level:
        return name or ""
    parts = package.split(".")
    parts = parts[:len(parts) - level + 1]
    return ".".join(parts + ([name] if name else []))


def _is_import_module(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module" and bool(node.args)
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith("."))


def layering_violations(root: Path) -> list[str]:
    """One line per import that goes up a layer, or from a torch-free package to torch or hpu_backend."""
    problems = []
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            module = module_name(path, root / folder, package)
            for line, target in imports(path, module):
                problem = _check_import(module, target)
                if problem:
                    problems.append(f"{path.relative_to(root)}:{line}: {module} imports {target} ({problem})")
    return problems


def _check_import(module: str, target: str) -> str | None:
    here, there = layer_of(module), layer_of(target)
    if there is not None and there > here:
        return f"{prefix_of(module)} is below {prefix_of(target)}"
    top = target.split(".")[0]
    free = prefix_of(module)
    if free in TORCH_FREE and (top == "torch" and module not in TORCH_EXCEPTIONS or top == "hpurecipe"
                               or (free == "recipecache" and top == "hpu_backend")):
        return f"{free} must not import {top}"
    return None


def init_violations(root: Path) -> dict[str, list[str]]:
    """Per package __init__: the statements that are neither imports nor re-export bookkeeping."""
    found = {}
    for folder in PACKAGES:
        for path in sorted((root / folder).rglob("__init__.py")):
            extra = [_describe(s) for s in ast.parse(path.read_text()).body if not _re_export(s)]
            if extra:
                found[str(path.relative_to(root))] = extra
    return found


def _re_export(stmt: ast.stmt) -> bool:
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
        return True  # the docstring
    if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
        return all(isinstance(t, ast.Name) and t.id in INIT_NAMES for t in targets)
    return isinstance(stmt, ast.FunctionDef) and stmt.name in INIT_NAMES


def _describe(stmt: ast.stmt) -> str:
    name = getattr(stmt, "name", None) or ast.unparse(stmt).split("\n")[0][:60]
    return f"line {stmt.lineno}: {name}"


def test_no_module_imports_a_higher_layer_or_torch_from_recipecache():
    assert layering_violations(ROOT) == []


def unplaced_modules(root: Path) -> list[str]:
    """Modules of hpu_backend that sit on no floor of their own (only the package __init__ may)."""
    found = []
    for path in sorted((root / "hpu_backend").rglob("*.py")):
        module = module_name(path, root / "hpu_backend", "hpu_backend")
        if module != "hpu_backend" and prefix_of(module) == "hpu_backend":
            found.append(module)
    return found


def test_every_module_has_a_floor():
    assert unplaced_modules(ROOT) == []


def test_package_inits_only_re_export():
    found = init_violations(ROOT)
    assert {path: found[path] for path in found if path not in INIT_EXCEPTIONS} == {}
    stale = sorted(set(INIT_EXCEPTIONS) - set(found))
    assert stale == [], f"these __init__ files only re-export now; drop them from INIT_EXCEPTIONS: {stale}"


def _modules(root: Path):
    for path in sorted((root / "hpu_backend").rglob("*.py")):
        yield path, module_name(path, root / "hpu_backend", "hpu_backend")


def _called(tree: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and (getattr(n.func, "id", None) == name or getattr(n.func, "attr",
                                                                                           None) == name)
               for n in ast.walk(tree))


def bucket_loops(root: Path) -> list[str]:
    """Modules outside the lowering package that run the bucket passes themselves."""
    return [module for path, module in _modules(root) if not module.startswith("hpu_backend.lowering")
            and _called(ast.parse(path.read_text()), "lower_bucket")]


def observers_at_import(root: Path) -> list[str]:
    """Modules that subscribe to events or runs in a statement run at import (not inside a function or class)."""
    found = []
    for path, module in _modules(root):
        top = [s for s in ast.parse(path.read_text()).body
               if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
        if any(_called(s, name) for s in top for name in ("observe_runs", "observe_every_run", "listen")):
            found.append(module)
    return found


def test_the_session_runs_the_one_bucket_loop():
    assert bucket_loops(ROOT) == ["hpu_backend.serve.session"]


def test_no_module_subscribes_to_a_session_when_imported():
    assert observers_at_import(ROOT) == []


def test_the_checkers_find_a_second_bucket_loop_and_an_observer_at_import(tmp_path):
    (tmp_path / "hpu_backend" / "shipping").mkdir(parents=True)
    (tmp_path / "hpu_backend" / "shipping" / "loop.py").write_text(
        "def at(t, ctx):\n    return lower_bucket(t, ctx)\n")
    (tmp_path / "hpu_backend" / "shipping" / "watch.py").write_text("session.observe_runs(print)\n")
    assert bucket_loops(tmp_path) == ["hpu_backend.shipping.loop"]
    assert observers_at_import(tmp_path) == ["hpu_backend.shipping.watch"]


@pytest.mark.parametrize("folder, source, expected", [
    ("recipecache", "import torch\n", "recipecache must not import torch"),
    ("recipecache", "def f():\n    from hpu_backend import store\n", "recipecache is below hpu_backend"),
    ("hpu_backend/lowering", "from ..serve import compiled\n", "hpu_backend.lowering is below hpu_backend.serve"),
    ("hpu_backend/serve", "def f():\n    from ..gaudi import sdpa\n", "hpu_backend.serve is below hpu_backend.gaudi"),
    ("hpu_backend/formats", "import torch\n", "hpu_backend.formats must not import torch"),
    ("hpu_backend/shipping", "import importlib\nimportlib.import_module('hpurecipe.main')\n",
     "hpu_backend.shipping is below hpurecipe"),
])
def test_the_checker_finds_an_upward_import_anywhere_in_a_module(tmp_path, folder, source, expected):
    for package in PACKAGES:
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
    (tmp_path / folder).mkdir(parents=True, exist_ok=True)
    (tmp_path / folder / "planted.py").write_text(source)
    problems = layering_violations(tmp_path)
    assert len(problems) == 1 and expected in problems[0] and "planted.py" in problems[0]


def test_the_checker_finds_code_in_a_package_init(tmp_path):
    for package in PACKAGES:
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
    (tmp_path / "recipecache" / "__init__.py").write_text('"""Doc."""\nfrom .cache import X\n__all__ = ["X"]\n'
                                                          'def helper():\n    return 1\n')
    assert init_violations(tmp_path) == {"recipecache/__init__.py": ["line 4: helper"]}

