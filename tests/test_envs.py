"""The table of environment variables (hpu_backend/envs.py): every variable the code reads is in it, its entries
parse and refuse values as they say, the compile options' variables match Settings, and the page is current."""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
from pathlib import Path

import pytest

from hpu_backend import envs
from hpu_backend.errors import HpuBackendError
from hpu_backend.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("hpu_backend", "recipecache", "cli/hpurecipe")
READS = re.compile(r"environ|getenv|\benvs\.")  # a module that reads (or writes) the environment
NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)*$")
OURS = re.compile(r"^(PT_HPU|HPU|HPURECIPE|VLLM)_[A-Z0-9_]+$")  # our prefixes: a variable wherever it is written
# Upper-case string constants of modules that read the environment which are not variables, each with its reason.
NOT_VARIABLES = {
    "GAUDI2": "a device name (device/module.py)", "GAUDI3": "a device name (device/module.py)",
    "IMPL": "torch.library's dispatch key (device/setup.py)", "RELEASES": "a table's name in a message",
    "STRATEGIES": "a table's name in a message", "INSTALLER": "a file of a distribution's metadata",
    "METADATA": "a file of a distribution's metadata", "RECORD": "a file of a distribution's metadata",
    "FILE": "argparse's metavar", "SC_AVPHYS_PAGES": "an os.sysconf name", "SC_PAGE_SIZE": "an os.sysconf name",
    "WRONGTYPE": "a Redis error reply", "PYTHONPATH": "Python's own, extended for the ranks and spawned workers",
}


def _known(name: str) -> bool:
    return name in envs.VARIABLES or any(re.fullmatch(f.pattern, name) for f in envs.FAMILIES)


def unlisted_variables(root: Path) -> list[str]:
    """``path: NAME`` for every variable-like constant of ours that the table does not hold."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            text = path.read_text()
            reads = bool(READS.search(text))
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and NAME.match(node.value):
                    name = node.value
                    candidate = OURS.match(name) or (reads and len(name) > 2)
                    if candidate and not _known(name) and name not in NOT_VARIABLES:
                        found.append(f"{path.relative_to(root)}: {name}")
    return sorted(set(found))


def test_every_variable_the_code_reads_is_in_the_table():
    assert unlisted_variables(ROOT) == []


def test_the_checker_finds_a_variable_missing_from_the_table(tmp_path):
    for folder in FOLDERS:
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "hpu_backend" / "planted.py").write_text('import os\nX = os.environ.get("MY_NEW_KNOB")\n')
    (tmp_path / "recipecache" / "planted.py").write_text('NAME = "HPU_RECIPE_CACHE_NEW"\n')  # ours, anywhere
    assert unlisted_variables(tmp_path) == ["hpu_backend/planted.py: MY_NEW_KNOB",
                                            "recipecache/planted.py: HPU_RECIPE_CACHE_NEW"]


def test_the_allow_list_holds_only_names_still_in_the_code():
    constants = set()
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*.py"):
            constants |= {n.value for n in ast.walk(ast.parse(path.read_text()))
                          if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert sorted(set(NOT_VARIABLES) - constants) == []
    assert sorted(set(NOT_VARIABLES) & set(envs.VARIABLES)) == []


def test_the_compile_options_variables_are_the_settings_ones():
    fields = {f.metadata["env"]: f for f in dataclasses.fields(Settings)}
    options = {v.name: v for v in envs.VARIABLES.values() if v.option}
    assert sorted(options) == sorted(fields)
    for name, var in options.items():
        f = fields[name]
        assert var.option == f.name
        assert var.choices == f.metadata["choices"]
        default = f.default if f.default is not None else ""
        assert var.default == (",".join(sorted(default)) if isinstance(default, frozenset) else default), name


def test_an_entry_reads_its_default_its_value_and_refuses_a_bad_one():
    assert envs.get("HPU_SIM_CARDS", {}) == 1 and envs.get("HPU_SIM_CARDS", {"HPU_SIM_CARDS": " "}) == 1
    assert envs.get("HPU_SIM_CARDS", {"HPU_SIM_CARDS": " 8 "}) == 8
    assert envs.get("ENABLE_CONSOLE", {"ENABLE_CONSOLE": "yes"}) is True
    assert envs.get("HPU_BACKEND_HBM_BYTES", {"HPU_BACKEND_HBM_BYTES": "1GiB"}) == 1 << 30
    assert envs.get("VLLM_GRAPH_RESERVED_MEM", {"VLLM_GRAPH_RESERVED_MEM": "0.2"}) == 0.2
    with pytest.raises(envs.EnvError, match=r"^environment variable HPU_SIM_CARDS='0' is not valid: use a whole "
                                            r"number of cards from 1 to 4096$"):
        envs.get("HPU_SIM_CARDS", {"HPU_SIM_CARDS": "0"})
    for name, bad in [("HPU_RECIPE_CACHE_POLICY", "fifo"), ("ENABLE_CONSOLE", "maybe"), ("RANK", "-1"),
                      ("HPU_BACKEND_HBM_BYTES", "lots"), ("HPU_RECIPE_CACHE_REMOTE_TTL", "nan")]:
        with pytest.raises(HpuBackendError, match=re.escape(f"{name}={bad!r}") + ".*use " +
                           re.escape(envs.VARIABLES[name].allowed())):
            envs.get(name, {name: bad})


def test_an_attribute_reads_the_environment_when_asked(monkeypatch):
    monkeypatch.setenv("HPU_SIM_CARDS", "3")
    assert envs.HPU_SIM_CARDS == 3
    monkeypatch.setenv("HPU_SIM_CARDS", "5")
    assert envs.HPU_SIM_CARDS == 5 and envs.is_set("HPU_SIM_CARDS")
    monkeypatch.delenv("HPU_SIM_CARDS")
    assert envs.HPU_SIM_CARDS == 1 and not envs.is_set("HPU_SIM_CARDS")
    with pytest.raises(AttributeError):
        envs.NOT_A_VARIABLE  # noqa: B018 (the read is the test)
    with pytest.raises(KeyError):
        envs.is_set("NOT_A_VARIABLE")


def test_every_entry_is_well_formed():
    kinds = {"flag", "int", "number", "text", "choice", "path", "size", "set"}
    for name, var in envs.VARIABLES.items():
        assert name == var.name and var.kind in kinds and var.readers and var.topic, name
        assert var.doc or var.option, f"{name} says nothing about what it does"
        assert (var.kind == "choice") == bool(var.choices), name
        assert (var.kind in ("int", "number")) == (var.low is not None and var.high is not None), name
        if var.default not in (None, "") and var.kind not in ("set", "path", "text"):
            assert var.parse(str(int(var.default) if var.kind == "flag" else var.default)) == var.default, name


def test_the_page_is_what_the_table_says():
    spec = importlib.util.spec_from_file_location("envdoc", ROOT / ".ci" / "envdoc.py")
    envdoc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(envdoc)
    page = (ROOT / "docs" / "reference" / "environment.md").read_text()
    assert page == envdoc.render(), "docs/reference/environment.md is out of date: run python .ci/envdoc.py --write"
    assert all(f"`{name}`" in page for name in envs.VARIABLES)
