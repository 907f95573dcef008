"""Entry format: round trips, version handling, and decode_entry's promise to raise only CorruptEntry."""

import hashlib
import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recipecache import FORMAT_VERSION, CorruptEntry, decode_entry, encode_entry
from recipecache.entry import DIGEST_SIZE, MAGIC, PREFIX_SIZE, decode_header
from recipecache.errors import VersionMismatch


def test_round_trip_keeps_key_payload_meta_and_created():
    meta = {"graph": "fw_0", "bucket": [1, 128], "compile_time_s": 2.5, "nested": {"ok": True, "none": None}}
    entry = decode_entry(encode_entry("ab12", b"\x00payload\xff", meta, created=123.5))
    assert (entry.key, entry.payload, entry.meta, entry.created, entry.version) == (
        "ab12", b"\x00payload\xff", meta, 123.5, FORMAT_VERSION)


def test_header_decodes_without_the_payload():
    data = encode_entry("k1", b"x" * 1000, {"m": 1}, created=7.0)
    header = decode_header(data[:100])
    assert (header.key, header.created, header.meta, header.payload_len) == ("k1", 7.0, {"m": 1}, 1000)
    assert header.total_size == len(data)


@pytest.mark.parametrize("key", ["", "a/b", "../x", "a" * 129, "ké", None, 12])
def test_bad_keys_are_value_errors(key):
    with pytest.raises(ValueError):
        encode_entry(key, b"")


@pytest.mark.parametrize("meta", [{1: "int key"}, {"huge": 2**70}, {"obj": object()}, ["not", "a", "map"],
                                  {"b": b"bytes"}])
def test_bad_meta_is_a_value_error(meta):
    with pytest.raises(ValueError):
        encode_entry("k", b"", meta)


def test_other_format_version_is_a_version_mismatch():
    data = bytearray(encode_entry("k", b"abc"))
    struct.pack_into("<H", data, 4, FORMAT_VERSION + 1)
    with pytest.raises(VersionMismatch):
        decode_entry(bytes(data))


def _reseal(prefix_fields, header: bytes, payload: bytes) -> bytes:
    """A well-formed container around an arbitrary header, with a correct checksum."""
    head = struct.pack("<4sHHIQ", *prefix_fields) + header
    return head + payload + hashlib.blake2b(head + payload, digest_size=DIGEST_SIZE).digest()


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_corrupt_entry(data):
    with pytest.raises(CorruptEntry):
        decode_entry(data)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.binary(max_size=50))
def test_checksummed_garbage_headers_raise_only_corrupt_entry(header, payload):
    # A valid checksum gets arbitrary bytes past the integrity check into the msgpack header decoder.
    data = _reseal((MAGIC, FORMAT_VERSION, 0, len(header), len(payload)), header, payload)
    try:
        entry = decode_entry(data)
    except CorruptEntry:
        return
    assert isinstance(entry.key, str) and isinstance(entry.meta, dict)


_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63,
                                                               2**64 - 1) | st.floats() | st.text() | st.binary(),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                       max_leaves=10)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["key", "created", "meta", "x"]), _values))
def test_checksummed_wrong_header_maps_raise_only_corrupt_entry(fields):
    header = msgpack.packb(fields, use_bin_type=True)
    data = _reseal((MAGIC, FORMAT_VERSION, 0, len(header), 3), header, b"abc")
    try:
        decode_entry(data)
    except CorruptEntry:
        return
    assert isinstance(fields.get("key"), str)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_single_byte_flip_or_truncation_is_detected(data):
    blob = encode_entry("abc", bytes(range(200)), {"m": [1, 2]}, created=5.0)
    index = data.draw(st.integers(0, len(blob) - 1))
    flipped = bytearray(blob)
    flipped[index] ^= data.draw(st.integers(1, 255))
    for broken in (bytes(flipped), blob[:index]):
        with pytest.raises(CorruptEntry):
            decode_entry(broken)


def test_prefix_size_is_what_the_format_says():
    assert PREFIX_SIZE == 20
