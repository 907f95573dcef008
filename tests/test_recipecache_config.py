"""CacheConfig: PT_HPU_RECIPE_CACHE_CONFIG parsing, defaults, per-rank directories."""

from pathlib import Path

import pytest

from recipecache import CacheConfig, ConfigError, default_cache_dir
from recipecache.config import ENV_VAR


def test_parse_reads_all_three_fields():
    cfg = CacheConfig.parse("/tmp/recipes,true,512")
    assert (cfg.path, cfg.delete_on_start, cfg.max_size_mb) == (Path("/tmp/recipes"), True, 512)
    assert cfg.limit_bytes == 512 * 1024 * 1024


def test_parse_allows_commas_in_the_path_and_spaces():
    cfg = CacheConfig.parse("/tmp/a,b , False , -1")
    assert (cfg.path, cfg.delete_on_start, cfg.limit_bytes) == (Path("/tmp/a,b"), False, None)


@pytest.mark.parametrize("value, field", [
    ("/tmp/x", "3 comma-separated fields"),
    ("/tmp/x,maybe,10", "delete_on_start"),
    ("/tmp/x,true,ten", "max_size_mb"),
    ("/tmp/x,true,-5", "max_size_mb"),
    (",true,10", "path"),
])
def test_malformed_values_name_the_field_and_show_the_form(value, field):
    with pytest.raises(ConfigError) as err:
        CacheConfig.parse(value)
    assert field in str(err.value)
    assert "<path>,<delete_on_start true|false>,<max_size_mb>" in str(err.value)


def test_unset_env_means_default_dir_no_delete_1024_mb(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cfg = CacheConfig.from_env({})
    assert (cfg.path, cfg.delete_on_start, cfg.max_size_mb) == (tmp_path / "hpu_backend" / "recipes", False, 1024)


def test_default_dir_without_xdg_is_under_home(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_cache_dir() == tmp_path / ".cache" / "hpu_backend" / "recipes"


def test_from_env_reads_the_variable_and_keeps_overrides(tmp_path):
    cfg = CacheConfig.from_env({ENV_VAR: f"{tmp_path},false,3"}, policy="created")
    assert (cfg.path, cfg.max_size_mb, cfg.policy) == (tmp_path, 3, "created")


@pytest.mark.parametrize("value", ["/tmp/recipes,true,512", "/tmp/a,b,false,-1", "/tmp/x,false,0",
                                   "relative/dir,true,0.5", "/tmp/with space,false,3"])
def test_config_string_gives_back_the_string_it_was_parsed_from(value):
    cfg = CacheConfig.parse(value)
    assert cfg.config_string() == value
    assert CacheConfig.parse(cfg.config_string()) == cfg


@pytest.mark.parametrize("delete, size", [(True, 2.5), (False, 1024), (False, -1), (True, 0), (False, 7.0)])
def test_config_string_round_trips_the_fields_it_carries(tmp_path, delete, size):
    cfg = CacheConfig(path=tmp_path / "a,b", delete_on_start=delete, max_size_mb=size, policy="lru")
    back = CacheConfig.parse(cfg.config_string(), policy="lru")
    assert (back.path, back.delete_on_start, back.max_size_mb, back.limit_bytes) == (
        cfg.path, cfg.delete_on_start, cfg.max_size_mb, cfg.limit_bytes)
    assert back == cfg


def test_config_string_refuses_a_path_the_string_cannot_carry(tmp_path):
    with pytest.raises(ConfigError, match="white space"):
        CacheConfig(path=f"{tmp_path}/trailing ").config_string()


@pytest.mark.parametrize("field", ["inf", "nan", "1e999"])
def test_a_size_that_is_not_a_finite_number_is_a_config_error(field):
    with pytest.raises(ConfigError, match="max_size_mb"):
        CacheConfig.parse(f"/tmp/x,false,{field}")
    with pytest.raises(ConfigError, match="max_size_mb"):
        CacheConfig(path="/tmp/x", max_size_mb=float(field))


@pytest.mark.parametrize("kwargs", [{"max_size_mb": -2}, {"policy": "fifo"}, {"memory_entries": -1},
                                    {"max_size_mb": "10"}])
def test_invalid_fields_are_config_errors(kwargs):
    with pytest.raises(ConfigError):
        CacheConfig(path="/tmp/x", **kwargs)


def test_per_rank_uses_a_separated_subdirectory(tmp_path):
    cfg = CacheConfig(path=tmp_path / "cache", per_rank=True)
    assert cfg.resolved_path({"RANK": "3", "LOCAL_RANK": "1"}) == tmp_path / "cache" / "rank3"
    assert cfg.resolved_path({"LOCAL_RANK": "1"}) == tmp_path / "cache" / "rank1"
    assert cfg.resolved_path({}) == tmp_path / "cache"


def test_rank_is_ignored_unless_per_rank(tmp_path):
    assert CacheConfig(path=tmp_path).resolved_path({"RANK": "0"}) == tmp_path


def test_non_integer_rank_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError):
        CacheConfig(path=tmp_path, per_rank=True).resolved_path({"RANK": "../x"})


def test_eviction_policy_defaults_to_gaudis_oldest_created_and_lru_is_an_option(tmp_path, monkeypatch):
    from recipecache.config import POLICY_ENV

    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert CacheConfig(path=tmp_path).policy == "created"
    monkeypatch.setenv(POLICY_ENV, "lru")
    assert CacheConfig(path=tmp_path).policy == "lru"
    assert CacheConfig.from_env({ENV_VAR: f"{tmp_path},false,3"}).policy == "lru"
    monkeypatch.setenv(POLICY_ENV, "fifo")
    with pytest.raises(ConfigError, match=POLICY_ENV):
        CacheConfig(path=tmp_path)


def test_the_limit_is_recorded_in_the_directory_for_tools_that_open_it_later(tmp_path, monkeypatch):
    from recipecache import RecipeCache
    from recipecache.config import recorded

    RecipeCache(CacheConfig(path=tmp_path / "c", max_size_mb=3, policy="lru", fsync=False))
    assert recorded(tmp_path / "c") == {"max_size_mb": 3, "policy": "lru"}
    (tmp_path / "c" / "config.json").write_text('{"max_size_mb": "huge"}')
    assert recorded(tmp_path / "c") is None  # a garbled record is ignored, not trusted


def test_a_remote_tier_without_its_client_warns_and_keeps_the_local_tiers(tmp_path, monkeypatch, caplog):
    import logging
    import sys

    from recipecache import RecipeCache

    monkeypatch.setitem(sys.modules, "redis", None)  # as if redis-py were not installed
    with caplog.at_level(logging.WARNING, "recipecache"):
        cache = RecipeCache(CacheConfig(path=tmp_path / "c", fsync=False, remote="redis://127.0.0.1:1/0"))
    assert "pip install 'hpu_backend[fleet]'" in caplog.text and cache.remote is None
    cache.put("aa", b"x", wait=True)
    assert cache.get("aa") == b"x"
    with pytest.raises(ConfigError, match="redis://host:port/db"):
        CacheConfig(path=tmp_path, remote="http://example.com")
