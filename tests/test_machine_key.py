"""This machine's own signing key (precompiled files without HPURECIPE_BUNDLE_KEY): made once, private, reused, and
refused in one line when its file is not one only this user can read."""

from __future__ import annotations

import os
import stat

import pytest

from recipecache.signing import (MACHINE, MACHINE_KEY_BYTES, TEAM, SigningKeyError, key_id, key_path, machine_key,
                                 own_signer)


@pytest.fixture
def config(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("HPURECIPE_BUNDLE_KEY", raising=False)
    return tmp_path / "config"


def test_the_key_is_made_once_0600_in_the_config_directory_and_reused(config):
    assert machine_key() is None and own_signer() is None  # reading never makes one
    assert not config.exists()
    signer = own_signer(create=True)
    path = config / "hpu_backend" / "machine.key"
    assert key_path() == path and signer.kind == MACHINE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.getuid()
    assert path.read_bytes() == signer.key and len(signer.key) == MACHINE_KEY_BYTES
    assert own_signer(create=True) == signer and machine_key() == signer.key  # reused, not made again
    assert [p.name for p in path.parent.iterdir()] == ["machine.key"]  # no temporary file left behind
    assert signer.record() == {"kind": MACHINE, "id": key_id(signer.key)} and len(signer.id) == 8
    assert signer.id != signer.key.hex()[:8]  # the id is the key's hash, not a piece of it


def test_another_user_gets_another_key_and_the_team_key_comes_first(config, tmp_path, monkeypatch):
    mine = own_signer(create=True)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "other"))
    assert own_signer(create=True).key != mine.key
    monkeypatch.setenv("HPURECIPE_BUNDLE_KEY", "team-secret")
    assert own_signer(create=True) == own_signer() and own_signer().kind == TEAM
    assert own_signer().key == b"team-secret"


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o660])
def test_a_key_file_others_may_read_is_refused_saying_what_to_do(config, mode):
    own_signer(create=True)
    path = key_path()
    path.chmod(mode)
    with pytest.raises(SigningKeyError, match=r"readable or writable by others; chmod 600 it") as e:
        own_signer(create=True)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_key_in_a_directory_others_may_write_is_refused(config, mode):
    """Whoever can write the key's directory can put their own key there and sign what this user loads."""
    key = machine_key(create=True)
    directory = key_path().parent
    directory.chmod(0o755)  # others may look, not write: fine
    assert machine_key() == key
    directory.chmod(mode)
    try:
        with pytest.raises(SigningKeyError, match=r"writable by others, so anyone could replace the key; chmod 700"):
            own_signer()
    finally:
        directory.chmod(0o700)


def test_a_link_a_directory_or_a_short_file_is_refused(config, tmp_path):
    path = key_path()
    path.parent.mkdir(mode=0o700, parents=True)
    target = tmp_path / "elsewhere.key"
    target.write_bytes(bytes(MACHINE_KEY_BYTES))
    target.chmod(0o600)
    path.symlink_to(target)
    with pytest.raises(SigningKeyError, match="is a link; remove it"):
        machine_key()
    path.unlink()
    path.mkdir()
    with pytest.raises(SigningKeyError, match="not a regular file; remove it"):
        own_signer(create=True)
    path.rmdir()
    path.write_bytes(b"short")
    path.chmod(0o600)
    with pytest.raises(SigningKeyError, match=r"not a signing key \(5 bytes, not 32\)"):
        machine_key()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="only root can give a file to another user")
def test_a_key_file_of_another_user_is_refused(config):
    own_signer(create=True)
    os.chown(key_path(), 65534, -1)
    with pytest.raises(SigningKeyError, match="belongs to another user; remove it"):
        machine_key()
