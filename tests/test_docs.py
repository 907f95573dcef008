"""The documentation: the command pages are what the application says, every page is in the site's navigation,
and every relative link of the README and the docs resolves."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# Pages another generator writes from a table in the code; linked from here, checked once they exist.
WRITTEN_ELSEWHERE = {"reference/environment.md"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


@pytest.fixture(scope="module")
def generator():
    spec = importlib.util.spec_from_file_location("docs_generator", ROOT / ".ci" / "docs.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def _pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def _nav() -> set[str]:
    """The pages the mkdocs.yml navigation names (read as text: no YAML library needed)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return set(re.findall(r":\s+(\S+\.md)\s*$", nav, re.M))


def test_the_command_pages_are_what_the_application_says(generator):
    assert generator.stale() == [], "run python .ci/docs.py --write"
    group = generator.application()
    assert {f"{name}.md" for name in group.commands} | {"index.md"} == {p.name for p in generator.PAGES.glob("*.md")}


def test_a_command_page_is_a_man_page_from_the_command_itself(generator):
    import click

    group = generator.application()
    command = group.commands["evict"]
    text = (generator.PAGES / "evict.md").read_text()
    sections = re.findall(r"^## (\S+(?: \S+)?)$", text, re.M)
    assert sections == ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS", "EXIT STATUS", "ENVIRONMENT", "FILES",
                        "EXAMPLES", "SEE ALSO"]
    assert generator.description(command) in text
    ctx = click.Context(command, info_name="evict", parent=click.Context(group, info_name="hpurecipe"))
    for param in command.params:
        flags, help_text = param.get_help_record(ctx)
        assert f"- `{flags}`: {' '.join(help_text.split())}" in text


def test_every_example_uses_options_its_command_has(generator):
    group = generator.application()
    for name, manual in generator.MANUAL.items():
        assert name in group.commands, f"{name}: no such command"
        flags = {opt for p in group.commands[name].params for opt in (*p.opts, *p.secondary_opts)}
        for example, _ in manual.examples:
            for command in example.split("&&"):
                words = shlex.split(command)
                words = words[next(i for i, w in enumerate(words) if w == "hpurecipe"):]
                if words[1] != name:
                    continue
                used = {w.split("=")[0] for w in words[2:] if w.startswith("-")}
                if name == "run":  # the script's own flags follow it
                    used = {w for w in used if words.index(w) < next(i for i, w in enumerate(words) if
                                                                      w.endswith(".py"))}
                assert used <= flags, f"{example}: {sorted(used - flags)} not options of {name}"


def test_every_docs_page_is_in_the_navigation_and_the_index():
    nav = _nav()
    pages = {str(p.relative_to(DOCS)) for p in _pages()}
    assert pages - nav == set(), "pages missing from mkdocs.yml's nav"
    assert nav - pages - WRITTEN_ELSEWHERE == set(), "nav entries with no page"
    index = (DOCS / "index.md").read_text()
    linked = {m for m in LINK.findall(index)}
    top = {p for p in pages | WRITTEN_ELSEWHERE if not p.startswith("reference/commands/") or p.endswith("index.md")}
    assert top - {"index.md"} - linked == set(), "pages docs/index.md does not link"


@pytest.mark.parametrize("page", [ROOT / "README.md", *_pages()], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # links inside code are not links
    text = re.sub(r"`[^`\n]*`", "", text)
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        link = Path(os.path.normpath(page.parent / target.split("#")[0]))
        inside = link.is_relative_to(DOCS)
        if page.is_relative_to(DOCS):  # the site holds docs/ only (docs/assets/results is the bench's results)
            assert inside, f"{page.relative_to(ROOT)}: {target} leaves docs/"
        if inside and str(link.relative_to(DOCS)) in WRITTEN_ELSEWHERE:
            continue
        assert link.exists(), f"{page.relative_to(ROOT)}: {target} does not resolve"
