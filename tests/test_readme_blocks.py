"""The docs check (.ci/readme.py): which blocks of the README and the docs pages it reruns, and that a console block
nobody reruns is refused."""

from __future__ import annotations

import importlib.util
import re
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


def test_the_readme_and_every_docs_page_have_no_unmarked_console_block(readme):
    pages = readme.all_pages()
    assert pages[0] == readme.README and len(pages) > 20
    blocks = [b for page in pages for b in readme.blocks(page.read_text().splitlines(), page.name)]
    assert any("--input-len" in b.command for b in blocks) and any("advise" in b.command for b in blocks)
    assert readme.walkthrough.PAGE in pages


def test_a_page_names_itself_in_what_the_check_refuses(readme):
    with pytest.raises(ValueError, match=r"^docs/x\.md:2: a console block with no output marker"):
        readme.blocks(["text", "```console", "```"], "docs/x.md")
    with pytest.raises(ValueError, match=r"^docs/x\.md:1: a python block with no marker"):
        readme.pyblocks.python_blocks(["```python", "x = 1", "```"], page="docs/x.md")


# The python blocks (.ci/pyblocks.py): markers, claims and their matching, on tiny README texts.

def test_python_claims_attach_to_the_statement_that_prints(readme):
    lines = ["<!-- python -->", "```python", "import math", "print(math.pi)  # -> 3.14...", "x = 2",
             "print(x)", "print(x + 1)", "# -> 3", "```"]
    (block,) = readme.pyblocks.python_blocks(lines)
    claimed = [(s.first, [(c.line, c.text, c.inline) for c in s.claims]) for s in block.statements]
    assert claimed == [(2, []), (3, [(3, "3.14...", True)]), (4, []), (5, []), (6, [(7, "3", False)])]
    assert readme.pyblocks.matches(["3.14..."], "3.141592653589793\n")
    assert not readme.pyblocks.matches(["3"], "4\n") and not readme.pyblocks.matches(["a", "b"], "a\n")


def test_a_continuing_block_right_after_a_console_block_runs_its_command(readme):
    lines = ["<!-- output: hpurecipe ls -->", "```console", "$ hpurecipe ls", "```", "",
             "<!-- python [continue] -->", "```python", "print(1)  # -> 1", "```"]
    (block,) = readme.pyblocks.python_blocks(lines, readme.blocks(lines))
    assert (block.command, block.console.command) == ("hpurecipe ls", "hpurecipe ls")


@pytest.mark.parametrize("lines, says", [
    (["```python", "x = 1", "```"], "README.md:1: a python block with no marker"),
    (["<!-- python -->", "", "```python", "```"], "README.md:1: a python marker must be right"),
    (["<!-- python [continue] -->", "```python", "x = 1", "```"], "README.md:1: the first python block has none"),
    (["<!-- python [quiet] -->", "```python", "```"], "unknown python marker option(s) quiet"),
    (["<!-- python -->", "```python", "x = 1", "", "# -> 1", "```"], "README.md:5: a claim (# ->) must end"),
    (["<!-- python fragment: needs a model -->", "```python", "f(model)  # -> 1", "```"],
     "README.md:2: a block that does not run claims no output"),
    (["<!-- python -->", "```python", "f(model", "```"], "README.md:3: '(' was never closed"),
], ids=["unmarked", "marker-apart", "continue-nothing", "unknown-option", "claim-apart", "fragment-claim", "syntax"])
def test_what_the_python_check_refuses(readme, lines, says):
    with pytest.raises(ValueError, match=r"^" + re.escape(says)):
        readme.pyblocks.python_blocks(lines)


def test_a_wrong_claim_is_rewritten_to_the_real_output(readme):
    lines = ["<!-- python -->", "```python", "print(1)  # -> 2", "print('a\\nb')", "# -> c", "```"]
    (block,) = readme.pyblocks.python_blocks(lines)
    first, second = (s for s in block.statements if s.claims)
    assert readme.pyblocks.rewrite(lines, first, "1\n") == (2, 3, ["print(1)  # -> 1"])
    assert readme.pyblocks.rewrite(lines, second, "a\nb\n") == (3, 5, ["print('a\\nb')", "# -> a", "# -> b"])


def test_every_python_block_of_the_readme_and_the_docs_is_marked(readme):
    examples = []
    for page in readme.all_pages():
        lines = page.read_text().splitlines()
        examples += readme.pyblocks.python_blocks(lines, readme.blocks(lines, page.name), page.name)
    assert any(b.console is not None for b in examples) and any(s.claims for b in examples for s in b.statements)


def test_blocks_run_in_one_session_and_a_raising_block_names_its_readme_line(readme):
    # a real child interpreter (no torch in it): names carry over with continue, /tmp/ is the session's directory
    lines = ["<!-- python -->", "```python", "import os", "open('/tmp/x', 'w').write('hi')", "n = 2", "```",
             "<!-- python [continue] -->", "```python", "print(n * 21)  # -> 41", "print(open('/tmp/x').read())",
             "# -> hi", "print(os.environ['HOME'] == os.path.dirname('/tmp/x'))  # -> True", "```"]
    examples = readme.pyblocks.python_blocks(lines)
    ((_, statement, output),) = readme.pyblocks.stale(examples, readme.pyblocks.run(examples))
    assert (statement.first, output) == (8, "42\n")
    broken = readme.pyblocks.python_blocks(["<!-- python -->", "```python", "x = 1", "1 / 0", "```"])
    with pytest.raises(RuntimeError, match=r"README.md:2 raised:[\s\S]*README.md\", line 4[\s\S]*ZeroDivision"):
        readme.pyblocks.run(broken)


def test_a_block_shows_the_stream_and_lines_its_options_keep(readme):
    block = readme.Block("hpurecipe run x.py", {"stderr": "", "grep": "step timeline:"}, 0, 0)
    shown = readme.shown(block, "loss 2.3\n", "── report\n   step timeline: 1 ms  \n   syncs: 0\n")
    assert shown == ["$ hpurecipe run x.py", "   step timeline: 1 ms"]
