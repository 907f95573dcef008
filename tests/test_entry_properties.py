"""Property tests: stored entries whose *structure* is mutated (checksum intact) never raise past the
loader, the backend's store, or the CLI's show and verify: each is a miss (quarantined) or a listed problem."""

from __future__ import annotations

import copy

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from hpu_backend.formats.program import Program, parse_payload
from hpu_backend.formats.recipe import RecipeFormatError
from hpu_backend.runtime import RecipeLoadError, build_callable
from hpu_backend.serve.session import Session
from hpu_backend.serve.store import RecipeStore
from hpu_backend.settings import Settings
from recipecache import CacheConfig, RecipeCache, decode_entry, encode_entry

from cli_helpers import cli

LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(-2**63, 2**64 - 1), st.floats(allow_nan=True),
    st.text(max_size=12), st.binary(max_size=12),
    st.lists(st.one_of(st.integers(-5, 5), st.text(max_size=4)), max_size=3),
    st.dictionaries(st.text(max_size=6), st.integers(-5, 5), max_size=3))


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2 + x.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """{"recipe": (key, raw, meta), "program": (key, raw, meta)} from a real compile with dynamic shapes."""
    cache_dir = tmp_path_factory.mktemp("prop") / "c"
    torch._dynamo.reset()
    options = {"cache_config": f"{cache_dir},false,64"}
    session = Session.open(Settings.from_options(options))
    compiled = torch.compile(Tiny(), backend="hpu_backend", dynamic=True, options=options)
    with session.use(), torch.no_grad():
        compiled(torch.randn(5, 8))
    session.flush()
    found = {}
    for path in sorted(cache_dir.glob("entries/*/*.rcp")):
        entry = decode_entry(path.read_bytes())
        kind = "program" if isinstance(parse_payload(entry.payload), Program) else "recipe"
        found[kind] = (entry.key, msgpack.unpackb(entry.payload, raw=False), entry.meta)
    assert set(found) == {"recipe", "program"}
    return found


def _paths(value, prefix=()):
    """Every place in a nested structure: (path, container is a dict)."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out += [prefix + (k,)] + _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += [prefix + (i,)] + _paths(v, prefix + (i,))
    return out


@st.composite
def mutated(draw, raw):
    raw = copy.deepcopy(raw)
    path = draw(st.sampled_from(_paths(raw)))
    parent = raw
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["replace", "delete", "wrap", "swap_type"]))
    last = path[-1]
    if action == "delete":
        del parent[last]
    elif action == "wrap":
        parent[last] = [parent[last]]
    elif action == "swap_type":
        parent[last] = {"r": parent[last]} if not isinstance(parent[last], dict) else list(parent[last].values())
    else:
        parent[last] = draw(LEAVES)
    return msgpack.packb(raw, use_bin_type=True)


def _cache(tmp_path, key, payload, meta) -> RecipeCache:
    cache = RecipeCache(CacheConfig(path=tmp_path / "c", fsync=False, memory_entries=0))
    path = cache.path / "entries" / key[:2] / f"{key}.rcp"
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    path.write_bytes(encode_entry(key, payload, meta))
    return cache


def _check_loaders(payload: bytes) -> None:
    try:
        parsed = parse_payload(payload)
    except RecipeFormatError:
        return
    if not isinstance(parsed, Program):
        try:
            build_callable(parsed)
        except RecipeLoadError:
            pass


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["recipe", "program"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_mutated_entry_is_a_format_or_load_error_and_a_store_miss(stored, tmp_path, kind, data):
    key, raw, meta = stored[kind]
    payload = data.draw(mutated(raw))
    _check_loaders(payload)  # raises anything else: a bug
    store = RecipeStore(_cache(tmp_path, key, payload, meta))
    if kind == "program":
        store.load_program(key)
    else:
        store.load(key, build_callable)


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["recipe", "program"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_show_and_verify_list_a_mutated_entry_without_failing(stored, tmp_path, kind, data):
    key, raw, meta = stored[kind]
    cache = _cache(tmp_path, key, data.draw(mutated(raw)), meta)
    for args in (["show", key], ["verify"]):
        result = cli(*args, "-d", cache.path, code=None)
        assert result.exit_code in (0, 1) and "unexpected" not in result.output, (args, result.output)
