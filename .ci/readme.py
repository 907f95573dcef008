#!/usr/bin/env python3
"""Every shell session in the README and in every page under docs/ is the output of a real run: the walk-through
(.ci/walkthrough.py) and each ```console block after an output marker, rerun here and written (--write) or
compared (--check, CI). Pages are checked one after another; PAGES given on the command line limit the run to
them (the walk-through runs with the page that holds it).

To add a block, put a marker on the line right before its fence, then run --write --only WORDS:

    <!-- output: hpurecipe analyze models/gpt.py --lazy -->
    ```console
    (filled in by --write: "$ " and the command, then what it printed, stdout then stderr)
    ```

Options go in brackets before the colon, comma-separated: ``<!-- output [stderr, head=12]: COMMAND -->``
``stdout`` / ``stderr`` keep one stream only; ``head=N`` keeps the first N lines of the output; ``grep=TEXT``
the lines that hold TEXT (one line of a long report, say); ``sizes``
compares byte sizes loosely (for files whose size follows the checkout's path, such as precompiled artifacts).
Each command runs from the repository root in a fresh HOME and a fresh, empty recipe cache, with ``hpurecipe``
and ``python`` meaning this checkout's, and must exit 0. Leading ``NAME=value`` words set the command's
environment, and a path under ``/tmp/`` lies in that run's own temporary directory; the output shows the
checkout's own paths relative to it. ``--check`` compares with times, ages, key hashes and
the temporary paths normalised (and graph numbers: see normalised), so it fails only when the commands, tables,
counts or sizes differ from what a user sees (estimated sizes, batches and tokens/s are compared as printed).
A ```console block without a marker fails the check: a session nobody reruns drifts. So does a ```python
block: each has a marker too, and runs with the values it claims to print compared (see .ci/pyblocks.py).

    python .ci/readme.py --write [--only WORDS]   # rerun the blocks (those whose command holds WORDS)
    python .ci/readme.py --write --python         # rerun the python blocks only, rewriting wrong claims
    python .ci/readme.py --check                  # exit 1 with a diff per block that is out of date
    python .ci/readme.py --check docs/guides/advisor.md README.md   # those pages only
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pyblocks  # noqa: E402  (sibling scripts, not a package)
import walkthrough  # noqa: E402

ROOT = walkthrough.ROOT
README = ROOT / "README.md"


def all_pages() -> list[Path]:
    """The README, then every page under docs/ in path order."""
    return [README, *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!-- output(?: \[(?P<options>[^\]]*)\])?: (?P<command>.+?) -->$")
FENCE = "```console"
TIMEOUT_S = 1800  # one command; the slowest (a 70B plan across cards) takes a few minutes


@dataclass
class Block:
    """One marked block: its command, options, and where its body lies in its page (line numbers)."""

    command: str
    options: dict[str, str]
    start: int  # the first body line (after the fence)
    end: int  # the closing fence
    page: str = "README.md"  # the page it is on, as its messages name it


def blocks(lines: list[str], page: str = "README.md") -> list[Block]:
    """Every marked block; ValueError naming the line of a console block with no marker, or a marker with no
    console block after it (the walk-through's block, between its own markers, is left to walkthrough.py)."""
    found, in_walkthrough = [], False
    for i, line in enumerate(lines):
        if line.startswith("<!-- walkthrough:"):
            in_walkthrough = "begin" in line
        marker = MARKER.match(line)
        if marker and (i + 1 >= len(lines) or lines[i + 1] != FENCE):
            raise ValueError(f"{page}:{i + 1}: an output marker must be right before a {FENCE} fence")
        if line == FENCE and not in_walkthrough and not (i and MARKER.match(lines[i - 1])):
            raise ValueError(f"{page}:{i + 1}: a console block with no output marker before it "
                             "(see .ci/readme.py)")
        if marker:
            end = lines.index("```", i + 2)
            found.append(Block(marker["command"], _options(marker["options"]), i + 2, end, page))
    return found


def _options(text: str | None) -> dict[str, str]:
    pairs = [o.strip().partition("=") for o in (text or "").split(",") if o.strip()]
    options = {k: v for k, _, v in pairs}
    unknown = set(options) - {"stdout", "stderr", "head", "grep", "sizes"}
    if unknown:
        raise ValueError(f"unknown output marker option(s) {', '.join(sorted(unknown))}")
    return options


def run(block: Block) -> list[str]:
    """The block's lines from a real run: "$ COMMAND", then its output (as the options select)."""
    with tempfile.TemporaryDirectory() as tmp:
        assignments, argv = pyblocks.command_argv(block.command, tmp)
        env = dict(pyblocks.session_env(tmp), **assignments)
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=TIMEOUT_S)
        seconds = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"{block.command}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        stdout, stderr = (out.replace(tmp, "/tmp").replace(f"{ROOT}/", "") for out in (proc.stdout, proc.stderr))
    print(f"{seconds:6.1f} s  {block.command}", file=sys.stderr)
    return shown(block, stdout, stderr)


def shown(block: Block, stdout: str, stderr: str) -> list[str]:
    """What the block shows of a run that printed these: "$ COMMAND", then the streams its options keep."""
    streams = [s for s in ("stdout", "stderr") if s in block.options] or ["stdout", "stderr"]
    out = "".join({"stdout": stdout, "stderr": stderr}[s] for s in streams)
    lines = [line.rstrip() for line in out.rstrip("\n").splitlines()]
    if "grep" in block.options:
        lines = [line for line in lines if block.options["grep"] in line]
    if "head" in block.options:
        lines = lines[:int(block.options["head"])]
    return [f"$ {block.command}", *lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the blocks (and python claims) from real runs")
    mode.add_argument("--check", action="store_true", help="exit 1 if a block is out of date")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--only", help="only the console blocks whose command holds this text")
    which.add_argument("--python", action="store_true", help="only the python blocks")
    parser.add_argument("pages", nargs="*", type=Path, help="only these pages (default: README.md and docs/)")
    args = parser.parse_args()
    pages = [p.resolve() for p in args.pages] or all_pages()
    missing = [str(p) for p in pages if not p.is_file()]
    if missing:
        print(f"error: no such page: {', '.join(missing)}", file=sys.stderr)
        return 1
    stale = outputs = examples = 0
    for page in pages:
        try:
            got = check_page(page, args)
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        stale, outputs, examples = stale + got[0], outputs + got[1], examples + got[2]
    walk = args.only is None and not args.python and walkthrough.PAGE in pages
    if walk:  # the walk-through: its own script, run the same way
        stale += subprocess.run([sys.executable, str(Path(__file__).with_name("walkthrough.py")),
                                 "--write" if args.write else "--check"]).returncode != 0
    if stale:
        print(f"{stale} block(s) or claim(s) out of date: run python .ci/readme.py --write", file=sys.stderr)
        return 1
    done = "written from real runs" if args.write else "match a real run"
    print(f"{len(pages)} page(s): {outputs} output blocks, {examples} python blocks"
          f"{' and the walk-through' if walk else ''} {done}")
    return 0


def check_page(path: Path, args) -> tuple[int, int, int]:
    """Rerun one page's blocks: (how many are out of date, output blocks run, python blocks); with --write the
    page is rewritten from the runs. ValueError for a block the check refuses."""
    page = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    console = blocks(lines, page)
    examples = pyblocks.python_blocks(lines, console, page) if args.only is None else []
    in_sessions = {id(e.console): e for e in examples if e.console is not None}  # run there, not on their own
    chosen = [] if args.python else [b for b in console if id(b) not in in_sessions
                                     and (args.only is None or args.only in b.command)]
    with ThreadPoolExecutor(1) as pool:  # the python session beside the console blocks: each waits on subprocesses
        session = pool.submit(pyblocks.run, examples)
        got = [(b, run(b)) for b in chosen]
        outputs = session.result()
    got += [(e.console, shown(e.console, *outputs[e.fence]["command"])) for e in in_sessions.values()]
    edits = [(block.start, block.end, lines_got) for block, lines_got in got]
    stale = sum(args.check and _differs(lines[b.start:b.end], lines_got, b) for b, lines_got in got)
    wrong = pyblocks.stale(examples, outputs)
    edits += [pyblocks.rewrite(lines, statement, output) for _, statement, output in wrong]
    stale += 0 if args.write else len(wrong)
    if args.write and edits:
        for start, end, new in sorted(edits, reverse=True):  # from the end: earlier edits keep their lines
            lines[start:end] = new
        path.write_text("\n".join(lines) + "\n")
    return stale, len(got), len(examples)


def normalised(lines: list[str], sizes: bool = False) -> list[str]:
    """walkthrough.normalised, graph numbers (they count the graphs a process compiled before, which a planner
    running Dynamo more than once (advise) does not always reach in the same order) and the line of library code a
    finding names (the frame Dynamo attributes it to inside a library varies from run to run; the user's own lines
    are kept). ``sizes``: byte sizes too."""
    text = walkthrough.normalised("\n".join(lines))
    if sizes:
        text = re.sub(r"\b\d+(\.\d+)? (B|KiB|MiB|GiB)\b", "<size>", text)
    text = re.sub(r"(in library code: [^\s:()]+):\d+", r"\1:<line>", text)
    return re.sub(r"\b(fx_graph|lazy_graph)_\d{4}", r"\1_<n>", text).splitlines()


def _differs(want: list[str], got: list[str], block: Block) -> bool:
    command = block.command
    want_n, got_n = normalised(want, "sizes" in block.options), normalised(got, "sizes" in block.options)
    if want_n == got_n:
        return False
    sys.stdout.writelines(difflib.unified_diff([w + "\n" for w in want_n], [g + "\n" for g in got_n],
                                               f"{block.page} ({command})", "a real run"))
    return True


if __name__ == "__main__":
    sys.exit(main())
