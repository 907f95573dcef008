#!/usr/bin/env python3
"""The Python examples of the README and of every docs page, run as a reader runs them, with the values they
claim to print compared (.ci/readme.py runs them with the console blocks: --check in CI, --write to update the
claims).

Every ```python block of a page has a marker on the line right before its fence:

    <!-- python -->                            run the block in a fresh interpreter
    <!-- python [continue] -->                 run it in the interpreter of the python block before it (its names),
                                               or, right after a marked console block, where that block's command ran
    <!-- python: COMMAND -->                   run COMMAND first (as in an output marker; it must exit 0)
    <!-- python [file=/tmp/x.py]: COMMAND -->  write the block to that file instead of running it, then run COMMAND
    <!-- python fragment: REASON -->           never run, and REASON says why

A value the page says a statement prints is a claim: a comment ``# -> TEXT`` at the end of the statement's
last line, or comment lines ``# -> TEXT`` right after the statement, one per line of output. The statement's
standard output must be exactly its claims, where ``...`` stands for any text (a time, a count that varies).
A statement without a claim may print anything.

A page's blocks run in page order in one session, as a reader following the page in one shell would: one
temporary directory is HOME, so the recipe cache is the default one there; ``/tmp/`` in code and commands
means that directory; the working directory is the checkout (``models/gpt.py`` resolves), with ``hpurecipe``
and ``python`` this checkout's. So a block may use what an earlier one left: a warm cache, a package file.
Leading NAME=value words of a COMMAND set the environment of the command, its block and the blocks that
continue it. A block that continues a console block (right after it, blank lines apart) runs that block's
command as its own COMMAND, once, in a session of its own (a fresh HOME and cache, as for every console
block): the console block shows what the command printed there, compared as usual. Each statement is
compiled with its line number in the page, so a traceback names PAGE:LINE (README.md:LINE, docs/...:LINE).
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
import tokenize
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FENCE = "```python"
MARKER = re.compile(r"^<!-- python(?: \[(?P<options>[^\]]*)\])?(?:: (?P<command>.+?))? -->$")
FRAGMENT = re.compile(r"^<!-- python fragment: (?P<reason>\S.*?) -->$")
CLAIM = re.compile(r"^# ->(?: (?P<text>.*))?$")
TIMEOUT_S = 900  # one session of continued blocks; the slowest (warm, prebuild, plans) takes about a minute


@dataclass
class Claim:
    line: int  # the page's index of the line holding it
    text: str
    inline: bool


@dataclass
class Statement:
    first: int  # the page's indices of its first and last lines
    last: int
    claims: list[Claim] = field(default_factory=list)


@dataclass
class PyBlock:
    """One python block: its marker's parts and, for a block that runs, its top-level statements."""

    fence: int  # the page's index of the opening fence
    end: int  # and of the closing one
    code: str
    options: dict[str, str]
    command: str | None
    fragment: str | None
    statements: list[Statement]
    console: object = None  # the console block (readme.Block) this block continues, whose command it runs
    page: str = "README.md"  # the page it is on, as its messages name it


def python_blocks(lines: list[str], console: list = (), page: str = "README.md") -> list[PyBlock]:
    """Every python block with its marker; ValueError naming the page's line of a block with no marker, a
    marker with no block after it, or a claim that does not follow a statement. ``console``: the marked
    console blocks, which a python block may continue."""
    found = []
    for i, line in enumerate(lines):
        marked = MARKER.match(line) or FRAGMENT.match(line)
        if marked and (i + 1 >= len(lines) or lines[i + 1] != FENCE):
            raise ValueError(f"{page}:{i + 1}: a python marker must be right before a {FENCE} fence")
        if line == FENCE:
            if not (i and (MARKER.match(lines[i - 1]) or FRAGMENT.match(lines[i - 1]))):
                raise ValueError(f"{page}:{i + 1}: a python block with no marker before it (see .ci/pyblocks.py)")
            found.append(_block(lines, i, page))
    for before, block in itertools.pairwise([None, *found]):
        if "continue" in block.options:
            _continue(block, before, console, lines)
    return found


def _continue(block: PyBlock, before: PyBlock | None, console: list, lines: list[str]) -> None:
    """Bind a continuing block to the console block right before it (blank lines apart), if there is one."""
    shell = next((c for c in console if c.end < block.fence - 1
                  and not any(line.strip() for line in lines[c.end + 1:block.fence - 1])), None)
    if shell is not None:
        if block.command:
            raise ValueError(f"{block.page}:{block.fence}: a block that continues a console block runs its command")
        block.console, block.command = shell, shell.command
    elif before is None:
        raise ValueError(f"{block.page}:{block.fence}: the first python block has none before it to continue")


def _block(lines: list[str], fence: int, page: str) -> PyBlock:
    end = lines.index("```", fence + 1)
    code = "\n".join(lines[fence + 1:end]) + "\n"
    fragment = FRAGMENT.match(lines[fence - 1])
    marker = MARKER.match(lines[fence - 1])
    options = _options(marker["options"]) if marker else {}
    block = PyBlock(fence, end, code, options, marker["command"] if marker else None,
                    fragment["reason"] if fragment else None, [], page=page)
    if fragment or "file" in options:
        if "# ->" in code:
            raise ValueError(f"{page}:{fence + 1}: a block that does not run claims no output")
        return block
    block.statements = _statements(code, fence + 1, page)
    _attach_claims(block, _claims(code, fence + 1))
    return block


def _options(text: str | None) -> dict[str, str]:
    pairs = [o.strip().partition("=") for o in (text or "").split(",") if o.strip()]
    options = {k: v for k, _, v in pairs}
    unknown = set(options) - {"continue", "file"}
    if unknown:
        raise ValueError(f"unknown python marker option(s) {', '.join(sorted(unknown))}")
    if "continue" in options and "file" in options:
        raise ValueError("a python block written to a file does not run, so it continues nothing")
    return options


def _statements(code: str, offset: int, page: str) -> list[Statement]:
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        raise ValueError(f"{page}:{offset + (e.lineno or 1)}: {e.msg} (mark a fragment as one)") from None
    return [Statement(offset + s.lineno - 1, offset + s.end_lineno - 1) for s in tree.body]


def _claims(code: str, offset: int) -> list[Claim]:
    claims, tokens = [], list(tokenize.generate_tokens(io.StringIO(code).readline))
    for prev, tok in itertools.pairwise([None, *tokens]):
        claim = CLAIM.match(tok.string) if tok.type == tokenize.COMMENT else None
        if claim:
            inline = prev is not None and prev.end[0] == tok.start[0] and prev.type not in (tokenize.NL,
                                                                                          tokenize.INDENT)
            claims.append(Claim(offset + tok.start[0] - 1, (claim["text"] or "").rstrip(), inline))
    return claims


def _attach_claims(block: PyBlock, claims: list[Claim]) -> None:
    """Each claim to its statement: inline on its last line, or on the lines right after it."""
    for claim in claims:
        owner = next((s for s in reversed(block.statements) if s.first <= claim.line), None)
        expected = None if owner is None else owner.last if claim.inline else (
            owner.claims[-1].line + 1 if owner.claims and not owner.claims[-1].inline else owner.last + 1)
        if owner is None or claim.line != expected:
            raise ValueError(f"{block.page}:{claim.line + 1}: a claim (# ->) must end a statement's last line or "
                             "follow the statement or its claims directly")
        owner.claims.append(claim)


# Running: the parent groups blocks into sessions of continued blocks and runs each in a child interpreter.

def session_env(tmp: str, cache: bool = True) -> dict[str, str]:
    """The environment every command and block of a page runs in: a fresh HOME (its config too) under ``tmp``, and a
    recipe cache there (``cache``: ``/tmp/recipes``, else the default one in HOME, as a new user has)."""
    env = dict(os.environ, HOME=tmp, COLUMNS="160", PT_HPU_RECIPE_CACHE_CONFIG=f"{tmp}/recipes,false,4096",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "cli"), os.environ.get("PYTHONPATH", "")]))
    env.pop("HPU_RECIPE_CACHE_REMOTE", None)
    env.pop("XDG_CONFIG_HOME", None)  # a new user's config (its signing key) is in the fresh HOME too
    if not cache:
        env.pop("PT_HPU_RECIPE_CACHE_CONFIG")
    return env


def command_argv(command: str, tmp: str) -> tuple[dict[str, str], list[str]]:
    """A page's command's leading NAME=value words and its argv, ``/tmp/`` meaning ``tmp`` and ``hpurecipe`` and
    ``python`` this checkout's."""
    words = shlex.split(command)
    assignments = list(itertools.takewhile(lambda w: re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w), words))
    argv = [w.replace("/tmp/", f"{tmp}/") for w in words[len(assignments):]]
    program = {"hpurecipe": [sys.executable, "-m", "hpurecipe.main"], "python": [sys.executable]}
    return dict(a.split("=", 1) for a in assignments), program.get(argv[0], argv[:1]) + argv[1:]


def run(blocks: list[PyBlock]) -> dict[int, dict]:
    """Each runnable block's ``statements`` outputs and its ``command``'s (stdout, stderr), keyed by the block's
    fence line, from one session per page (the blocks given are one page's)."""
    outputs: dict[int, dict] = {}
    if not blocks:
        return outputs
    with tempfile.TemporaryDirectory() as shared:
        for group in _sessions([b for b in blocks if b.fragment is None]):
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as own:  # a console block's command runs on a fresh cache
                tmp = own if group[0].console is not None else shared
                for block, got in zip(group, _run_session(group, tmp)):
                    outputs[block.fence] = json.loads(json.dumps(got).replace(tmp, "/tmp").replace(f"{ROOT}/", ""))
            lines = ", ".join(f"{b.page}:{b.fence + 1}" for b in group)
            print(f"{time.perf_counter() - start:6.1f} s  python blocks at {lines}", file=sys.stderr)
    return outputs


def _sessions(blocks: list[PyBlock]) -> list[list[PyBlock]]:
    groups: list[list[PyBlock]] = []
    for block in blocks:
        if "continue" in block.options and block.console is None:
            groups[-1].append(block)
        else:
            groups.append([block])
    return groups


def _run_session(group: list[PyBlock], tmp: str) -> list[dict]:
    job = Path(tmp) / ".readme-session.json"
    job.write_text(json.dumps([{"code": b.code.replace("/tmp/", f"{tmp}/"), "line": b.fence + 1, "page": b.page,
                                "command": b.command, "file": b.options.get("file")} for b in group]))
    proc = subprocess.run([sys.executable, __file__, "--session", str(job), tmp], capture_output=True, text=True,
                          env=session_env(tmp, cache=False), cwd=ROOT, timeout=TIMEOUT_S)
    result = Path(f"{job}.out")
    if proc.returncode != 0 or not result.exists():
        raise RuntimeError(f"python blocks at {group[0].page}:{group[0].fence + 1}: exit {proc.returncode}\n"
                           f"{proc.stderr[-3000:]}")
    done = json.loads(result.read_text())
    result.unlink()
    if done["error"]:
        raise RuntimeError(done["error"].replace(tmp, "/tmp"))
    return done["outputs"]


def _session_main(job: str, tmp: str) -> int:
    """In the child: each step's command, file or statements; outputs (or the first error) to JOB.out."""
    outputs: list[dict] = []
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    error = None
    for step in json.loads(Path(job).read_text()):
        try:
            outputs.append(_run_step(step, namespace, tmp))
        except Exception:  # a block that raises fails the check with its traceback (the page's line numbers)
            error = f"python block at {step['page']}:{step['line']} raised:\n{traceback.format_exc(limit=-6)}"
            break
    Path(f"{job}.out").write_text(json.dumps({"outputs": outputs, "error": error}))
    return 0


def _run_step(step: dict, namespace: dict, tmp: str) -> dict:
    done: dict = {"command": None, "statements": []}
    if step["file"]:
        Path(step["file"].replace("/tmp/", f"{tmp}/")).write_text(step["code"])
    if step["command"]:
        env, argv = command_argv(step["command"], tmp)
        os.environ.update(env)
        proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        if proc.returncode != 0:
            raise RuntimeError(f"{step['command']}: exit {proc.returncode}\n{proc.stdout}{proc.stderr}"[-3000:])
        done["command"] = [proc.stdout, proc.stderr]
    if step["file"]:
        return done
    tree = ast.parse(step["code"])
    ast.increment_lineno(tree, step["line"])
    for statement in tree.body:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile(ast.Module([statement], type_ignores=[]), step["page"], "exec"), namespace)
        done["statements"].append(out.getvalue())
    return done


# Comparing and rewriting claims.

def matches(claims: list[str], output: str) -> bool:
    """Whether the output is the claims, line for line, ``...`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in "\n".join(claims).split("..."))
    return re.fullmatch(pattern, _lines(output), re.DOTALL) is not None


def _lines(output: str) -> str:
    return "\n".join(line.rstrip() for line in output.rstrip("\n").splitlines())


def stale(blocks: list[PyBlock], outputs: dict[int, dict]) -> list[tuple[PyBlock, Statement, str]]:
    """Every statement whose output is not what its claims say, with that output; a diff of each printed."""
    found = []
    for block in blocks:
        for statement, output in zip(block.statements, outputs.get(block.fence, {}).get("statements", [])):
            want = [c.text for c in statement.claims]
            if want and not matches(want, output):
                found.append((block, statement, output))
                sys.stdout.writelines(difflib.unified_diff([w + "\n" for w in want],
                                                           [g + "\n" for g in _lines(output).splitlines()],
                                                           f"{block.page}:{statement.first + 1}", "a real run"))
    return found


def rewrite(lines: list[str], statement: Statement, output: str) -> tuple[int, int, list[str]]:
    """The edit that makes a statement's claims its real output: (start, end, new lines) of the page."""
    got = _lines(output).splitlines() or [""]
    last = lines[statement.last]
    inline = [c for c in statement.claims if c.inline]
    if inline and len(statement.claims) == 1 and len(got) == 1:
        return statement.last, statement.last + 1, [last[:last.rindex("# ->")] + f"# -> {got[0]}".rstrip()]
    own = [c for c in statement.claims if not c.inline]
    indent = re.match(r"\s*", lines[own[0].line] if own else last).group()
    head = [last[:last.rindex("# ->")].rstrip()] if inline else [last]
    end = own[-1].line + 1 if own else statement.last + 1
    return statement.last, end, head + [f"{indent}# -> {g}".rstrip() for g in got]


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--session":
    sys.exit(_session_main(sys.argv[2], sys.argv[3]))
