"""One compile session: the parsed settings, the recipe store and the run observers that every front end
hands its graphs to.

A front end (``torch.compile``'s backend, lazy mode, HPU graphs, packages, capacity planning, warm-up) opens
a session or receives one, and hands it graphs. The session owns the one bucket loop (``recipes``: policy →
bucket → bucket passes), the one answer to a graph that cannot be lowered (``graph_step``: strict mode raises,
else one warning and the graph runs eagerly) and the events: ``listen`` to what graphs take up and use,
``observe_runs`` for every run. A tool takes the store from the session it opened and never looks it up again.

``torch.compile`` hands the backend nothing but options, so the backend takes the session in use (``use``),
else the process's own, opened at the first compile; a compile whose cache configuration differs opens a
session of its own, which becomes the process's. Tests open a session over a throwaway store.

Events carry their data (names, keys, values), so an observer never reads a graph's state. A listener is
scoped to its ``with`` block by a context variable: a serving process's warm-up must observe graphs
compiled before it subscribed, so subscription cannot be a compile option.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, TypeVar

from ..formats.recipe import Recipe
from ..lowering import LoweringContext, LoweringError
from recipecache import CacheConfig, ConfigError

from ..settings import Settings, SettingsError
from .store import RecipeStore

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    """What a compiled graph reports to listeners."""

    kind: str  # "take" | "use" | "program"
    graph: str = ""  # the compiled graph's name (fx_graph_0003_fw); "" for "program"
    recipe: Recipe | None = None  # None for "program", and for a graph running eagerly
    hit: bool = False  # taken from the store rather than compiled
    key: str | None = None  # "take"/"use": the recipe's cache key (None: not cached)
    program: str | None = None  # the key of the stored program the graph belongs to, if any
    env: dict[str, int] | None = None  # "use": the call's symbol values
    compiled_for: str = ""  # "take" of a lowered recipe: "new graph" | "guard failure" | "new bucket"
    source: Any = None  # the emitting CompiledGraph, for tests and benchmarks that call it
    missed: tuple[str, ...] = ()  # "take" or "program" missed: what differs from the entry under another key


Listener = Callable[[Event], None]
RunObserver = Callable[[Recipe | None, list, list], None]  # fn(recipe, args, outputs); recipe None: ran eagerly
_listeners: contextvars.ContextVar[tuple[Listener, ...]] = contextvars.ContextVar("hpu_backend_listeners",
                                                                                  default=())


@contextlib.contextmanager
def listen(listener: Listener):
    """Call ``listener(event)`` for every event in this block (this thread or task only)."""
    token = _listeners.set((*_listeners.get(), listener))
    try:
        yield
    finally:
        _listeners.reset(token)


def listening() -> bool:
    return bool(_listeners.get())


def emit(event: Event) -> None:
    for listener in _listeners.get():
        listener(event)


@contextlib.contextmanager
def collect_recipes():
    """Collect ``(compiled_graph, recipe, hit)`` for every recipe a graph takes up in this block."""
    found: list = []

    def on_event(e: Event):
        if e.kind == "take":
            found.append((e.source, e.recipe, e.hit))

    with listen(on_event):
        yield found


# Observers of every run of every session, from the moment they start: the simulated device's memory counters,
# started by the device or by their first reading (``device/memory.py``), so that until then a compiled call
# pays nothing for them. Never filled at import (tests/test_layering.py).
EVERY_RUN: list[RunObserver] = []


def observe_every_run(fn: RunObserver) -> None:
    """Call ``fn(recipe, args, outputs)`` after every run of every session's graphs from now on (once per fn)."""
    if fn not in EVERY_RUN:
        EVERY_RUN.append(fn)


@dataclass
class Session:
    """Settings, the store they ask for, and the observers of every run of the session's graphs."""

    settings: Settings
    store: RecipeStore = field(default_factory=RecipeStore)  # default: a store that caches nothing
    runs: list[RunObserver] = field(default_factory=list)  # shared by the sessions derived (and EVERY_RUN's too)

    listen = staticmethod(listen)
    emit = staticmethod(emit)

    @classmethod
    def open(cls, settings: Settings, runs: list[RunObserver] | None = None) -> "Session":
        """A session over the store ``settings`` ask for (SettingsError for a malformed cache configuration)."""
        config = cache_config(settings)
        store = RecipeStore.open(config)
        return cls(settings, store) if runs is None else cls(settings, store, runs)

    def with_settings(self, settings: Settings) -> "Session":
        """This session's store and observers under other settings (one compile's options)."""
        return dataclasses.replace(self, settings=settings)

    def observe_runs(self, fn: RunObserver) -> None:
        """Call ``fn(recipe, args, outputs)`` after every run of this session's graphs (once per fn)."""
        if fn not in self.runs:
            self.runs.append(fn)

    def recipes(self, template: Recipe, ctx: LoweringContext,
                buckets: Iterable[Mapping[str, list[int]]]) -> Iterator[Recipe]:
        """The bucket passes over ``template`` for each bucket (symbol -> [lo, hi]), one recipe per bucket."""
        from ..lowering import lower_bucket  # a miss only: a hit never imports the pipeline

        for bucket in buckets:
            yield lower_bucket(template, ctx.for_bucket(bucket))

    def graph_step(self, name: str, lower: Callable[[], T], eager: Callable[[], T] | None) -> T:
        """``lower()``, the graph ``name`` lowered; after a LoweringError, the one policy of every front end: in
        strict mode (or with no ``eager`` form) the error is raised, otherwise one warning says why and
        ``eager()`` runs the graph as traced."""
        try:
            return lower()
        except LoweringError as e:
            if self.settings.strict or eager is None:
                raise
            log.warning("hpu_backend: could not lower %s, running it eagerly: %s", name, e.reason)
            log.debug("lowering failure of %s in full:\n%s", name, e)
            return eager()

    def buckets(self, symbols: list[str], values: Iterable[tuple[int, ...]]) -> list[dict[str, list[int]]]:
        """The bucket (symbol -> [lo, hi]) the settings' policies put each tuple of symbol values in."""
        policies = self.settings.bucket_policies(symbols)
        return [{s: list(p.bucket(v)) for s, p, v in zip(symbols, policies, vals)} for vals in values]

    def flush(self) -> None:
        """Wait until every recipe put into the store is on disk."""
        self.store.flush()

    @contextlib.contextmanager
    def use(self):
        """Make this the session ``torch.compile`` and lazy mode compile in, in this block (this thread or task)."""
        token = _in_use.set(self)
        try:
            yield self
        finally:
            _in_use.reset(token)


def cache_config(settings: Settings) -> CacheConfig | None:
    """The disk cache configuration these settings ask for: None with ``cache=False``, else the ``cache_config``
    option or its environment variable (parsed once, by Settings), else the defaults."""
    if not settings.cache:
        return None
    return settings.cache_config if settings.cache_config is not None else default_config()


def default_config() -> CacheConfig:
    """The configuration of ``PT_HPU_RECIPE_CACHE_CONFIG``, else the defaults (SettingsError if malformed)."""
    try:
        return CacheConfig.from_env()
    except ConfigError as e:
        raise SettingsError(str(e)) from None


_in_use: contextvars.ContextVar[Session | None] = contextvars.ContextVar("hpu_backend_session", default=None)
_process: list[Session] = []  # the process's session: opened by the first compile that had none in use
_process_lock = threading.Lock()


def process_observers() -> list[RunObserver]:
    """The run observers of the process's session (none before one opened): what a graph run outside every
    session (an HPU-graph replay of a captured recipe) reports to."""
    return list(_process[0].runs) if _process else []


def session_for(settings: Settings) -> Session:
    """The session a front end given only settings compiles in: the one in use, else the process's, under
    these settings; a new one when neither holds the store these settings ask for."""
    config = cache_config(settings)
    current = _in_use.get()
    if current is not None and current.store.serves(config):
        return current.with_settings(settings)
    with _process_lock:
        if _process and _process[0].store.serves(config):
            return _process[0].with_settings(settings)
        opened = Session.open(settings, _process[0].runs if _process else None)
        if _process:  # the graphs compiled in it keep it; what they put is on disk before others read there
            _process[0].flush()
        _process[:] = [opened]
        return opened
