"""Pure parts of the storage layer: key validation, URIs, part sizes, durations."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from g2rpo.artifacts.gc import parse_duration
from g2rpo.artifacts.publish import unique_uri
from g2rpo.artifacts.storage import FileStore, MiB, S3Store, locate, open_store, part_size_for, validate_key
from g2rpo.errors import G2RPOError


@pytest.mark.parametrize("key", ["a", "a/b/c.bin", "runs/r-1/model.safetensors", "x.y/z_1"])
def test_storage_valid_keys_pass(key):
    assert validate_key(key) == key


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("../etc/passwd", "'..'"),
        ("a/../b", "'..'"),
        ("a/./b", "'.'"),
        ("/abs/path", "leading '/'"),
        ("a//b", "empty path segment"),
        ("a/b/", "empty path segment"),
        ("", "must not be empty"),
        ("a\\b", "backslashes"),
        ("a/.g2rpo-lock-x", "reserved"),
    ],
)
def test_storage_bad_keys_name_key_and_fix(key, hint):
    with pytest.raises(G2RPOError) as err:
        validate_key(key)
    message = str(err.value)
    assert message.startswith(f"key={key!r}")
    assert hint in message


def test_storage_bad_key_refused_by_both_stores(tmp_path):
    store = FileStore(tmp_path)
    with pytest.raises(G2RPOError, match=r"'\.\.'"):
        store.put_bytes("a/../../escape", b"x")
    assert not (tmp_path.parent / "escape").exists()
    s3 = S3Store("bucket", "p", client=object())  # the key check runs before any request
    with pytest.raises(G2RPOError, match="leading '/'"):
        s3.put_bytes("/x", b"x")


def test_storage_part_size_scales_with_file():
    # Below 8 MiB × 10,000 = 80 GiB the minimum part holds: 40 GB → 8 MiB parts, ceil(40e9 / 8 MiB) = 4769 parts.
    assert part_size_for(40 * 10**9) == 8 * MiB
    # 200 GB: ceil(2e11 / 10,000) = 2e7 bytes = 19.07 MiB → rounded up to 20 MiB; 2e11 / 20 MiB = 9537 parts.
    size = 200 * 10**9
    part = part_size_for(size)
    assert part == 20 * MiB
    assert -(-size // part) <= 10_000
    # A tiny file keeps the minimum part size it was given.
    assert part_size_for(1, min_part=5 * MiB) == 5 * MiB
    # 10,000 parts of 5 GiB is S3's largest object: one byte more cannot be uploaded.
    with pytest.raises(G2RPOError, match="too big"):
        part_size_for(10_000 * 5 * 1024 * MiB + 1)


def test_storage_uris_open_the_right_store(tmp_path):
    assert isinstance(open_store(str(tmp_path)), FileStore)
    assert open_store(tmp_path.as_uri()).root == tmp_path
    s3 = open_store("s3://my-bucket/a/b")
    assert isinstance(s3, S3Store) and s3.bucket == "my-bucket" and s3.prefix == "a/b"
    store, key = locate("s3://my-bucket/a/b/c.txt")
    assert (store.prefix, key) == ("a/b", "c.txt")
    with pytest.raises(G2RPOError, match="at least 3 characters"):
        open_store("s3://ab/x")
    with pytest.raises(G2RPOError, match="unsupported scheme"):
        open_store("gs://bucket/x")
    with pytest.raises(G2RPOError, match="'..'"):
        open_store("s3://bucket/a/../b")


def test_storage_durations():
    assert parse_duration("90s") == timedelta(seconds=90)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("2w") == timedelta(days=14)
    with pytest.raises(G2RPOError, match="--older-than='7 days'"):
        parse_duration("7 days")


def test_storage_uri_separators_are_not_silently_dropped(tmp_path):
    # An empty segment right after the bucket is refused (it used to be stripped: 's3://b//x' wrote 'x').
    with pytest.raises(G2RPOError, match="uri path='/x'.*drop the leading '/'"):
        open_store("s3://bucket//x")
    with pytest.raises(G2RPOError, match="empty path segment"):
        open_store("s3://bucket/a//x")
    # One trailing '/' names a prefix, so a store root may be written either way ...
    assert open_store("s3://bucket/runs/").prefix == "runs"
    # ... but an object URI must name the object: 's3://b/a/' used to upload to the key 'a'.
    with pytest.raises(G2RPOError, match="names a folder/prefix"):
        locate("s3://bucket/prompts/")
    with pytest.raises(G2RPOError, match="names a folder/prefix"):
        locate(f"{tmp_path}/prompts/")
    # urlparse would silently cut a query or fragment off the key.
    with pytest.raises(G2RPOError, match="'\\?' and '#'"):
        open_store("s3://bucket/a?versionId=1")
    with pytest.raises(G2RPOError, match="'\\?' and '#'"):
        locate("s3://bucket/a#b")


def test_storage_unique_uri_keeps_bucket_and_parent(tmp_path):
    uri = unique_uri("s3://bucket/exports/model")
    # 'model-' + 16-character UTC stamp + '-' + 8 hex digits.
    assert re.fullmatch(r"s3://bucket/exports/model-\d{8}T\d{6}Z-[0-9a-f]{8}", uri), uri
    assert re.fullmatch(r"s3://bucket/model-\d{8}T\d{6}Z-[0-9a-f]{8}", unique_uri("s3://bucket/model/")), uri
    local = unique_uri(str(tmp_path / "runs" / "model"))
    assert local.startswith(str(tmp_path / "runs" / "model-"))
    # A unique *bucket* name is never what the caller meant.
    for bucket_only in ("s3://bucket", "s3://bucket/"):
        with pytest.raises(G2RPOError, match="name the artifact below the bucket"):
            unique_uri(bucket_only)
