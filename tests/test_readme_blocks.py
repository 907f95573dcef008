"""The README check (.ci/readme.py): which blocks it reruns, and that a console block nobody reruns is refused."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "readme.py"


@pytest.fixture(scope="module")
def readme():
    spec = importlib.util.spec_from_file_location("readme_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    return module


def test_marked_blocks_are_found_with_their_command_and_options(readme):
    lines = ["text", "<!-- output [stderr, head=3]: hpurecipe ls -->", "```console", "$ hpurecipe ls", "old", "```",
             "<!-- walkthrough: begin -->", "```console", "$ anything", "```", "<!-- walkthrough: end -->"]
    (block,) = readme.blocks(lines)
    assert (block.command, block.options, block.start, block.end) == ("hpurecipe ls", {"stderr": "", "head": "3"},
                                                                      3, 5)


@pytest.mark.parametrize("lines, says", [
    (["```console", "$ hpurecipe ls", "```"], "README.md:1: a console block with no output marker"),
    (["<!-- output: hpurecipe ls -->", "", "```console", "```"], "README.md:1: an output marker must be right"),
    (["<!-- output [tail=3]: hpurecipe ls -->", "```console", "```"], "unknown output marker option(s) tail"),
], ids=["unmarked", "marker-apart", "unknown-option"])
def test_what_the_check_refuses(readme, lines, says):
    with pytest.raises(ValueError, match=r"^" + says.replace("(", r"\(").replace(")", r"\)")):
        readme.blocks(lines)


def test_the_readme_itself_has_no_unmarked_console_block(readme):
    blocks = readme.blocks(readme.README.read_text().splitlines())
    assert any("--input-len" in b.command for b in blocks) and any("advise" in b.command for b in blocks)
