#!/usr/bin/env python3
"""docs/reference/environment.md, generated from the table of environment variables (hpu_backend/envs.py) and,
for the variables that set a compile option, from the option's own text (hpu_backend/settings.py); and the table
of compile options in docs/reference/compile-options.md, generated from hpu_backend/settings.py.

    python .ci/envdoc.py --write   # regenerate the page and the table
    python .ci/envdoc.py --check   # exit 1 when either is not what the code says (CI, tests/test_envs.py)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "reference" / "environment.md"
OPTIONS_PAGE = PAGE.with_name("compile-options.md")
BEGIN = "<!-- the table below is generated from hpu_backend/settings.py: python .ci/envdoc.py --write -->"
END = "<!-- end of the generated table -->"
INTRO = """\
# Environment variables

Every environment variable hpu_backend, its recipe cache and `hpurecipe` read or set, generated from the table in
`hpu_backend/envs.py` (`python .ci/envdoc.py --write`; do not edit this page by hand). A variable that is unset or
empty takes its default. A bad value stops with one line naming the variable and what it allows, e.g.
`environment variable HPU_SIM_CARDS='0' is not valid: use a whole number of cards from 1 to 4096`.

A compile option given to `torch.compile(..., options={...})` wins over its variable. "Set by the project" marks a
variable the launcher writes into the environment of the processes it starts (a rank reads it as torchrun's).
"""


def option_docs() -> dict[str, str]:
    """The text of each compile option, by option name (``Settings`` holds it)."""
    from hpu_backend.settings import Settings

    return {f.name: f.metadata["doc"] for f in dataclasses.fields(Settings)}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _default(var) -> str:
    if var.kind == "set":
        return "set by the project"
    if var.default in (None, ""):
        return "unset"
    if var.kind == "flag":
        return "1" if var.default else "0"
    return f"`{var.default}`"


def render() -> str:
    from hpu_backend import envs

    options = option_docs()
    topics: dict[str, list] = {}
    for var in envs.VARIABLES.values():
        topics.setdefault(var.topic, []).append(var)
    out = [INTRO]
    for topic, variables in topics.items():
        out += [f"## {topic}", "", "| Variable | Allowed | Default | What it does | Read by |", "|---|---|---|---|---|"]
        for var in variables:
            doc = f"the compile option `{var.option}`: {options[var.option]}" if var.option else var.doc
            out.append(f"| `{var.name}` | {_cell(var.allowed())} | {_default(var)} | {_cell(doc)} | "
                       f"{', '.join(f'`{r}`' for r in var.readers)} |")
        families = [f for f in envs.FAMILIES if f.topic == topic]
        if families:
            out += ["", "Families of variables (each name the pattern matches):", ""]
            out += [f"- `{f.pattern}` (e.g. `{f.example}`): {f.doc}; read by "
                    f"{', '.join(f'`{r}`' for r in f.readers)}" for f in families]
        out.append("")
    return "\n".join(out)


def options_table() -> str:
    """The compile options, one row per field of ``Settings``: its name, variable, default and text."""
    from hpu_backend.settings import Settings

    rows = [BEGIN, "", "| option | environment | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(Settings):
        value = str(f.default).lower() if isinstance(f.default, bool) else f.default
        empty = f.default is None or (not f.default and not isinstance(f.default, (bool, int)))
        default = "—" if empty else f"`{value}`"
        rows.append(f"| `{f.name}` | `{f.metadata['env']}` | {default} | {_cell(f.metadata['doc'])} |")
    return "\n".join([*rows, "", END])


def options_page() -> str:
    """compile-options.md with its table regenerated (the text around it is the page's own)."""
    text = OPTIONS_PAGE.read_text()
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[:start] + options_table() + text[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="regenerate the page")
    mode.add_argument("--check", action="store_true", help="exit 1 when the page is out of date")
    ns = parser.parse_args(argv)
    pages = {PAGE: render(), OPTIONS_PAGE: options_page()}
    if ns.write:
        for page, text in pages.items():
            page.write_text(text)
        return 0
    stale = [page for page, text in pages.items() if not page.exists() or page.read_text() != text]
    for page in stale:
        print(f"{page} is out of date: run python .ci/envdoc.py --write", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
