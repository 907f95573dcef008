"""Human output: one console, sizes, relative times, tables, and JSON for scripts."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Iterable, Mapping, Sequence

import typer
from rich.console import Console
from rich.markup import escape
from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from hpu_backend.units import size  # noqa: F401 (the one byte formatter; the commands call it as render.size)

# C0 and C1 control characters and DEL, except tab and newline: stored strings (model names, graph
# names, reasons) could otherwise move the cursor, recolour or retitle the user's terminal.
_CONTROL = {c: f"\\x{c:02x}" for c in [*range(0x00, 0x20), *range(0x7f, 0xa0)] if c not in (0x09, 0x0a)}


def clean(value: Any) -> str:
    """``str(value)`` with control characters shown as ``\\xNN`` escapes."""
    return str(value).translate(_CONTROL)


def _width(stream) -> int | None:
    """The terminal's width; for pipes and files, wide enough that tables are not folded."""
    if os.environ.get("COLUMNS", "").isdigit():
        return int(os.environ["COLUMNS"])
    return None if stream.isatty() else 160


console = Console(highlight=False, width=_width(sys.stdout))
err_console = Console(stderr=True, highlight=False, width=_width(sys.stderr))



def ago(t: float, now: float | None = None) -> str:
    """A time as '3 min ago' (or 'never' for 0)."""
    if not t:
        return "never"
    delta = (time.time() if now is None else now) - t
    if delta < 45:
        return "just now"
    for unit, seconds in (("d", 86400), ("h", 3600), ("min", 60)):
        if delta >= seconds:
            return f"{delta / seconds:.0f} {unit} ago"
    return f"{delta:.0f} s ago"


def duration(seconds: float) -> str:
    """A time in µs, ms, s or min (one spelling everywhere in the CLI's output)."""
    if seconds == 0:
        return "0 s"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min"


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]], title: str | None = None,
          right: Sequence[str] = ()) -> None:
    """Print a table: a bold header and columns two spaces apart; columns named in ``right`` are
    right-aligned (numbers). Laid out here rather than by rich, which takes ~0.5 ms a row."""
    cells = [["" if v is None else clean(v) for v in row] for row in rows]
    widths = [max([cell_len(c), *(cell_len(r[i]) for r in cells)]) for i, c in enumerate(columns)]

    def line(values: Sequence[str]) -> str:
        padded = [(" " * (w - cell_len(v)) + v) if c in right else (v + " " * (w - cell_len(v)))
                  for c, v, w in zip(columns, values, widths)]
        return "  ".join(padded).rstrip()

    if title is not None:
        console.print(Text(clean(title)))
    console.print(Text(line(list(columns)), style="bold"), soft_wrap=True)
    if cells:
        console.file.write("\n".join(line(r) for r in cells) + "\n")
        console.file.flush()


def pairs(items: Mapping[str, Any], title: str | None = None) -> None:
    """Print a two-column name/value table."""
    if title:
        console.print(f"[bold]{escape(clean(title))}[/bold]")
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="dim")
    t.add_column(overflow="fold")
    for k, v in items.items():
        t.add_row(Text(clean(k)), Text("" if v is None else clean(v)))
    console.print(t)


def emit_json(doc: Any) -> None:
    """Print JSON on stdout (never through rich, so it is never wrapped or coloured)."""
    typer.echo(json.dumps(doc, indent=1, sort_keys=True, default=str))


def note(text: str, *data: Any) -> None:
    """Print ``text`` (rich markup) with ``{}`` fields filled by ``data``, escaped so it is never read as markup."""
    console.print(text.format(*(escape(clean(d)) for d in data)) if data else text, soft_wrap=True)


def warn(text: str) -> None:
    """One line on stderr: ``warning: text``."""
    err_console.print(f"[yellow]warning:[/yellow] {escape(clean(text))}", soft_wrap=True)


def bucket(b: Mapping[str, Any] | None) -> str:
    """{'s0': [0, 16], 's1': [17, 32]} → 's0=0-16 s1=17-32'; an empty bucket (static graph) → 'static'."""
    if not b:
        return "static"
    return " ".join(f"{s}={r[0]}-{r[1]}" if r[0] != r[1] else f"{s}={r[0]}" for s, r in b.items())


def point(values: Mapping[str, int]) -> str:
    """{'batch': 16, 'seq': 128} → 'batch=16 seq=128' (as model files' points are labelled)."""
    return " ".join(f"{k}={v}" for k, v in values.items())


def plural(n: int, word: str) -> str:
    """'1 entry', '2 entries', '3 manifests'."""
    if n == 1:
        return f"1 {word}"
    return f"{n} {word[:-1]}ies" if word.endswith("y") else f"{n} {word}s"
