"""The layers hold: cli (hpurecipe) → hpu_backend.aot → hpu_backend → recipecache, read from every import.

Each module's imports are parsed with ``ast`` (imports inside functions, and ``importlib.import_module``
of a literal name, included); a module may import its own layer or a lower one, never a higher one.
``recipecache`` imports neither torch nor hpu_backend, and a package ``__init__`` only re-exports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Source folder -> the import name of its package.
PACKAGES = {"cli/hpurecipe": "hpurecipe", "hpu_backend": "hpu_backend", "recipecache": "recipecache"}
LAYERS = ("recipecache", "hpu_backend", "hpu_backend.aot", "hpurecipe")  # bottom to top
TORCH_FREE = ("recipecache",)
# What a package __init__ may hold besides imports and its docstring: the names it exports, and the lazy
# loader of those names (so that importing the package stays cheap).
INIT_NAMES = {"__all__", "_EXPORTS", "__getattr__", "__dir__"}
# Known exceptions, each with its reason; the test fails when one no longer applies, so the list shrinks.
INIT_EXCEPTIONS: dict[str, str] = {}


def layer_of(module: str) -> int | None:
    """The layer index of a module of ours (0 = recipecache), None for anything else."""
    best = None
    for i, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            best = i  # the longest matching prefix wins: hpu_backend.aot over hpu_backend
    return best


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
        return f"{LAYERS[here]} is below {LAYERS[there]}"
    top = target.split(".")[0]
    if module.split(".")[0] in TORCH_FREE and top in ("torch", "hpu_backend", "hpurecipe"):
        return f"{module.split('.')[0]} must not import {top}"
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


def test_package_inits_only_re_export():
    found = init_violations(ROOT)
    assert {path: found[path] for path in found if path not in INIT_EXCEPTIONS} == {}
    stale = sorted(set(INIT_EXCEPTIONS) - set(found))
    assert stale == [], f"these __init__ files only re-export now; drop them from INIT_EXCEPTIONS: {stale}"


@pytest.mark.parametrize("folder, source, expected", [
    ("recipecache", "import torch\n", "recipecache must not import torch"),
    ("recipecache", "def f():\n    from hpu_backend import store\n", "recipecache is below hpu_backend"),
    ("hpu_backend", "from .aot import warm\n", "hpu_backend is below hpu_backend.aot"),
    ("hpu_backend/aot", "import importlib\nimportlib.import_module('hpurecipe.main')\n",
     "hpu_backend.aot is below hpurecipe"),
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
