"""What ``warm`` prints: the per-bucket progress bar, the report table and why the cache lacks entries the
buckets use (shared by ``warm`` over a model file's axes and over a serving plan's buckets)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Iterator

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from recipecache.config import ENV_VAR

from . import render
from .errors import fail

if TYPE_CHECKING:
    from hpu_backend.shipping.reports import PointResult, WarmReport


@contextlib.contextmanager
def progress(total: int, quiet: bool) -> Iterator:
    """A progress bar on stderr showing the last bucket done (compiled or hit, time), and its callback; on a
    terminal only (the bar is gone when done), and not with ``quiet`` (--json)."""
    if quiet or not render.err_console.is_terminal:
        yield None
        return
    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("{task.fields[last]}"), console=render.err_console, transient=True)

    def on_point(p: PointResult) -> None:
        bar.update(task, advance=1, last=f"{p.label}: {p.status}, {render.duration(p.seconds)}")

    with bar:
        task = bar.add_task("buckets", total=total, last="compiling the first bucket...")
        yield on_point


def finish(report: WarmReport, config, json: bool, check: bool) -> None:
    for warning in report.warnings:
        render.warn(warning)
    path = report.manifest
    if json:
        render.emit_json({**report.to_dict(), "manifest": str(path)})
    else:
        print_report(report, check)
        s = report.summary()
        render.note("{} shape points using {} distinct recipes: {} compiled, {} reused (from the cache or "
                    "an earlier point), in {}. Manifest: {}", s["buckets"], s["recipes"], s["compiled"], s["hits"],
                    render.duration(s["seconds"]), path or "not written")
        if s["fallback_ops"]:
            render.note("CPU fallback ops: {} (they run on the host, not the device)",
                        ", ".join(s["fallback_ops"]))
        if s.get("ranks"):
            render.note("{} ranks: {}; {} compiled in all, one per distinct recipe.", s["cards"],
                        shared_ranks(s["ranks"]), s["compiled"])
        for line in s.get("missed", []):  # the cache held these graphs, built under another key: say what differs
            render.warn(f"missed an entry the cache holds under another key: {line}")
    if report.fit is not None and not report.fit.fits:
        why = not_kept(report.fit, config)
        if check or report.fit.stored_nothing:  # a CI warm step must not pass having stored nothing
            raise fail(why)
        render.warn(why)
    if report.summary()["mismatches"]:
        raise fail(f"{report.summary()['mismatches']} buckets differ from eager (see --check above)")


def not_kept(fit, config) -> str:
    """Why the cache lacks entries the buckets use, cause by cause (the size only when entries were trimmed)."""
    of = f"of the {fit.needed} entries these buckets use"
    causes = []
    if fit.unstored and fit.disk_problem:
        causes.append(f"{len(fit.unstored)} {of} could not be stored: the cache at {config.resolved_path()} "
                      f"cannot be written ({fit.disk_problem})")
    elif fit.unstored:
        causes.append(f"{len(fit.unstored)} {of} are gone without a record in the eviction log (deleted by "
                      "hand, or never written)")
    if fit.removed:
        hows = sorted(set(fit.removed.values()))
        causes.append(f"{len(fit.removed)} {of} were removed during the run ({'; '.join(hows)})")
    if fit.trimmed:
        causes.append(too_small(fit, config))
    prefix = "the cache holds none of the entries these buckets use: " if fit.stored_nothing else ""
    return prefix + "; ".join(causes) + ("" if fit.unstored and fit.disk_problem else ". Warm again")


def too_small(fit, config) -> str:
    """The cache is too small for what the buckets use: how many entries went, and the size it needs."""
    mb = f"{fit.suggested_mb:g}"
    others = f", and the cache holds {render.size(fit.other_bytes)} of other entries" if fit.other_bytes else ""
    return (f"the cache is too small: {len(fit.trimmed)} of the {fit.needed} entries these buckets use were "
            f"evicted (limit {render.size(fit.limit_bytes)}; they take {render.size(fit.needed_bytes)}{others}). "
            f"Give it at least {mb} MiB, e.g. {ENV_VAR}={config.resolved_path()},false,{mb}")


def shared_ranks(ranks: list[dict]) -> str:
    """"ranks 0-7 use the same 2 recipes", or per group of ranks with the same recipes when they differ."""
    groups: dict[int, list[int]] = {}
    for r in ranks:
        groups.setdefault(r["same_as"], []).append(r["rank"])
    recipes = {r["rank"]: r["recipes"] for r in ranks}
    return "; ".join(f"{_span(members)} {'use the same' if len(members) > 1 else 'uses its own'} "
                     f"{render.plural(recipes[first], 'recipe')}" for first, members in groups.items())


def _span(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def print_report(report: WarmReport, check: bool) -> None:
    ranked = report.cards > 1
    columns = ["rank"] * ranked + ["bucket", "status", "recipes", "compiled", "hits", "fallbacks", "time"] + (
        ["max |diff|", "check"] if check else [])
    rows = []
    for p in report.points:
        row = [p.rank] * ranked + [p.label, p.status, len(p.keys), p.compiled, p.hits, len(p.fallback_ops),
                                   render.duration(p.seconds)]
        if check:
            row += [f"{p.max_abs_diff:.2e}" if p.max_abs_diff is not None else "-", p.check_error or "ok"]
        rows.append(row)
    render.table(columns, rows, right=("rank", "recipes", "compiled", "hits", "fallbacks", "time", "max |diff|"))
