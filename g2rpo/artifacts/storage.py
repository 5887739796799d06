"""One storage layer over ``file://`` (and plain paths) and ``s3://``.

A :class:`Store` is rooted at a URI (``/data/artifacts``, ``file:///data/artifacts``,
``s3://bucket/prefix``) and addresses objects by *keys* relative to that root: ``a/b/c.bin``.
Keys are validated (:func:`validate_key`): no ``..`` or ``.`` segment, no absolute path, no empty
segment, no backslash, no NUL. Every store offers the same operations:

- ``put_bytes`` / ``get_bytes`` with *conditional writes*: ``if_none_match=True`` creates only if
  the key is absent, ``if_match=etag`` replaces only if the object is unchanged; a failed
  condition raises :class:`WriteConflict`. On S3 these are the ``If-None-Match: *`` and
  ``If-Match`` headers (answered with 412); on ``file://`` an atomic ``os.link`` of a finished
  temp file (create) and ``fcntl.flock`` around read-compare-``os.replace`` (update). The registry
  builds its alias/history updates on these.
- ``put_file`` / ``get_file`` (S3: boto3's managed transfer, multipart above a threshold with a
  part size from :func:`part_size_for`, so a file of any size fits in S3's 10,000 parts),
  ``head``, ``exists``, ``list`` (recursive, under a directory-like prefix), ``delete``.

S3 clients come from the standard AWS chain (environment, shared config/credentials files,
profiles, instance roles): the endpoint from ``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL`` or
:class:`S3Settings.endpoint_url` (MinIO, SeaweedFS, Ceph), path-style addressing by default, and
retries with exponential backoff done by botocore's retry modes (``standard``/``adaptive``), not by
a loop here.

Manifests, atomic publish, verified downloads, the digest-keyed cache and garbage collection are
built on top of this in :mod:`g2rpo.artifacts.manifest` (format and checks), :mod:`~g2rpo.artifacts.publish`,
:mod:`~g2rpo.artifacts.cache` and :mod:`~g2rpo.artifacts.gc`.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import os
import secrets
import shutil
import stat
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Literal
from urllib.parse import unquote, urlparse

from pydantic import Field, model_validator

from g2rpo.config import Section
from g2rpo.errors import G2RPOError, problem, write_failure
from g2rpo.textfile import describe_kind

__all__ = [
    "MiB",
    "S3_MAX_PARTS",
    "S3_MIN_PART",
    "S3_MAX_PART",
    "ObjectInfo",
    "Store",
    "FileStore",
    "S3Store",
    "S3Settings",
    "WriteConflict",
    "ObjectNotFound",
    "validate_key",
    "open_store",
    "locate",
    "part_size_for",
    "sha256_file",
    "check_writable",
]

MiB = 1024 * 1024
S3_MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
S3_MIN_PART = 5 * MiB  # every part but the last must be at least this big
S3_MAX_PART = 5 * 1024 * MiB
S3_MAX_OBJECT = 5 * 1024 * 1024 * MiB  # S3's largest object, 5 TiB
# Names that a FileStore uses for its own temp and lock files; hidden from listings.
_RESERVED = ".g2rpo-"


class WriteConflict(G2RPOError):
    """A conditional write lost: the key already existed, or changed since it was read."""


class ObjectNotFound(G2RPOError):
    """The key does not exist in the store."""


@dataclass(frozen=True)
class ObjectInfo:
    """One stored object: key (relative to the store's root), size in bytes, last write, etag."""

    key: str
    size: int
    modified: datetime
    etag: str


# --------------------------------------------------------------------------- keys and URIs


def validate_key(key: str, field: str = "key", allow_empty: bool = False) -> str:
    """Return ``key`` if it is a safe relative object key, else raise a G2RPOError.

    Refused: absolute paths, ``..``/``.`` segments, empty segments (``a//b``, trailing ``/``),
    backslashes, NUL, and segments starting with ``.g2rpo-`` (reserved for the store itself).
    """
    if not isinstance(key, str):
        raise G2RPOError(problem(field, key, "an object key must be a string like 'runs/r1/model.safetensors'"))
    if key == "":
        if allow_empty:
            return key
        raise G2RPOError(
            problem(field, key, "an object key must not be empty; name the object, e.g. 'model.safetensors'")
        )
    if key.startswith("/"):
        raise G2RPOError(problem(field, key, "keys are relative to the store's root; drop the leading '/'"))
    if "\\" in key or "\x00" in key:
        raise G2RPOError(problem(field, key, "use '/' as the separator; backslashes and NUL are not allowed in keys"))
    for segment in key.split("/"):
        if segment == "":
            raise G2RPOError(problem(field, key, "empty path segment ('//' or a trailing '/'); remove it"))
        if segment in ("..", "."):
            raise G2RPOError(problem(field, key, f"'{segment}' segments are not allowed; write the key without them"))
        if segment.startswith(_RESERVED):
            raise G2RPOError(problem(field, key, f"segments starting with {_RESERVED!r} are reserved; rename it"))
    return key


def _parse(uri: str) -> tuple[str, str, str]:
    """``(scheme, bucket_or_root, key_prefix)`` of a URI; plain paths are ``file``."""
    if not isinstance(uri, str) or not uri:
        raise G2RPOError(problem("uri", uri, "give a local path, file:///abs/path or s3://bucket/prefix"))
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        bucket = parsed.netloc
        if len(bucket) < 3:
            raise G2RPOError(problem("uri", uri, "S3 bucket names have at least 3 characters: s3://bucket/prefix"))
        if parsed.query or parsed.fragment or uri.endswith(("?", "#")):
            raise G2RPOError(problem("uri", uri, "'?' and '#' are not allowed in S3 keys here; rename the object"))
        # One '/' after the bucket, and one trailing '/' naming a prefix ('s3://b/runs/'), are
        # separators; anything else empty ('s3://b//x', 's3://b/a//x') is refused by validate_key.
        prefix = parsed.path[1:] if parsed.path.startswith("/") else parsed.path
        prefix = prefix[:-1] if prefix.endswith("/") else prefix
        if prefix:
            validate_key(prefix, field="uri path")
        return "s3", bucket, prefix
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost"):
            raise G2RPOError(problem("uri", uri, "file URIs name a local path: file:///abs/path (three slashes)"))
        return "file", unquote(parsed.path), ""
    if parsed.scheme and len(parsed.scheme) > 1:  # one letter would be a Windows drive
        raise G2RPOError(problem("uri", uri, "unsupported scheme; use a local path, file:// or s3://"))
    return "file", uri, ""


# --------------------------------------------------------------------------- settings


class S3Settings(Section):
    """How to reach S3. Credentials always come from the standard AWS chain, never from here."""

    endpoint_url: str | None = Field(
        None,
        description="S3 endpoint (MinIO/SeaweedFS/Ceph); None uses AWS_ENDPOINT_URL_S3/AWS_ENDPOINT_URL or AWS",
    )
    region: str | None = Field(None, description="region; None uses AWS_DEFAULT_REGION / the AWS config file")
    addressing_style: Literal["path", "virtual", "auto"] = Field(
        "path", description="bucket addressing; 'path' works with every S3-compatible store"
    )
    retry_mode: Literal["standard", "adaptive"] = Field(
        "standard", description="botocore retry mode (exponential backoff with jitter)"
    )
    max_attempts: int = Field(5, ge=1, le=20, description="attempts per request, first one included")
    multipart_threshold: int = Field(
        64 * MiB, ge=S3_MIN_PART, le=S3_MAX_OBJECT, description="files at least this big upload in parts"
    )
    min_part_size: int = Field(
        8 * MiB, ge=S3_MIN_PART, le=S3_MAX_PART, description="smallest part size; grows with the file (part_size_for)"
    )
    max_concurrency: int = Field(4, ge=1, le=64, description="parallel part uploads/downloads per file")
    checksums: Literal["when_supported", "when_required"] = Field(
        "when_supported",
        description="botocore request checksums (CRC32 on uploads); 'when_required' for S3-compatible "
        "stores that reject them (g2rpo's own sha256 checks apply either way)",
    )
    connect_timeout: float = Field(10.0, gt=0, description="seconds to open a connection")
    read_timeout: float = Field(60.0, gt=0, description="seconds to wait for a response")

    @model_validator(mode="after")
    def _endpoint_is_a_url(self):
        if self.endpoint_url is not None and not _is_http_url(self.endpoint_url):
            raise ValueError(problem("endpoint_url", self.endpoint_url, "give a URL like http://127.0.0.1:8333"))
        return self

    @model_validator(mode="after")
    def _threshold_covers_part(self):
        if self.multipart_threshold < self.min_part_size:
            raise ValueError(
                problem(
                    "multipart_threshold",
                    self.multipart_threshold,
                    f"must be at least min_part_size ({self.min_part_size}); raise it or lower min_part_size",
                )
            )
        return self


def _is_http_url(text: str) -> bool:
    parsed = urlparse(text)
    return parsed.scheme in ("http", "https") and bool(parsed.netloc)


def part_size_for(size: int, min_part: int = 8 * MiB, max_parts: int = S3_MAX_PARTS) -> int:
    """Part size for a multipart upload of ``size`` bytes.

    ``part = max(min_part, ceil(size / max_parts))`` rounded up to a whole MiB, so a file never
    needs more than ``max_parts`` parts (S3: 10,000) and small files keep the minimum. Raises when
    even 5 GiB parts (S3's maximum) cannot hold the file.
    """
    if size < 0:
        raise G2RPOError(problem("size", size, "a file size cannot be negative"))
    part = max(min_part, math.ceil(size / max_parts))
    part = math.ceil(part / MiB) * MiB
    if part > S3_MAX_PART:
        raise G2RPOError(
            problem("size", size, f"too big for one S3 object ({max_parts} parts of at most 5 GiB); split the file")
        )
    return part


def check_writable(location: str | Path, field: str, *, kind: str = "dir") -> None:
    """Refuse, before any work starts, a local output that cannot be written: ``location`` is a folder
    (``kind="dir"``) or a file (``kind="file"``) to write, existing or to be created with its parents.

    Checks what the operating system says (``os.access``: permissions, ACLs, a read-only mount) on the
    location itself when it exists, else on its nearest existing parent, which must be a folder.
    ``s3://`` locations are left to the store (their credentials are checked when it opens).
    """
    text = str(location)
    if text.startswith("file://"):
        text = text.removeprefix("file://")
    elif "://" in text:
        return
    path = Path(text)
    fix = "choose a location you can write to (or make this one writable)"
    if kind == "dir" and path.exists() and not path.is_dir():
        raise G2RPOError(problem(field, text, f"is a file, not a folder: {fix}"))
    if kind == "file" and path.is_dir():
        raise G2RPOError(problem(field, text, "is a folder: give the path of a file to write"))
    existing = path if path.exists() else path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir() and existing != path:
        raise G2RPOError(problem(field, text, f"cannot be created: {existing} is a file, not a folder: {fix}"))
    wanted = os.W_OK | (os.X_OK if existing.is_dir() else 0)
    if not os.access(existing, wanted):
        where = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise G2RPOError(problem(field, text, f"{where} (read-only): {fix}"))


def sha256_file(path: str | Path, chunk: int = 4 * MiB) -> tuple[int, str]:
    """``(size, sha256 hex)`` of a local file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
            size += len(block)
    return size, digest.hexdigest()


# --------------------------------------------------------------------------- the interface


def _check_size(uri: str, size: int, max_bytes: int | None) -> None:
    if max_bytes is not None and size > max_bytes:
        raise G2RPOError(
            f"{uri} is {size:,} bytes, over the {max_bytes:,}-byte limit for what g2rpo reads there (its records "
            "are far smaller): it is not one g2rpo wrote; check the URI, or remove the object"
        )


class Store(ABC):
    """Objects under one root URI, addressed by validated relative keys."""

    uri: str

    def uri_for(self, key: str = "") -> str:
        """The full URI of ``key`` (the root itself for an empty key)."""
        key = validate_key(key, allow_empty=True)
        return f"{self.uri.rstrip('/')}/{key}" if key else self.uri

    def child(self, prefix: str) -> Store:
        """A store rooted at ``prefix`` under this one."""
        return self._child(validate_key(prefix, field="prefix"))

    @abstractmethod
    def _child(self, prefix: str) -> Store: ...

    @abstractmethod
    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        """Write ``data``; returns the new etag. Conditional forms raise :class:`WriteConflict`."""

    @abstractmethod
    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        """``(data, etag)``; raises :class:`ObjectNotFound`, and a G2RPOError for an object over
        ``max_bytes`` (checked from its size before it is read: a record is never that large)."""

    @abstractmethod
    def head(self, key: str) -> ObjectInfo | None:
        """The object's info, or None when absent."""

    def exists(self, key: str) -> bool:
        return self.head(key) is not None

    @abstractmethod
    def put_file(self, key: str, path: str | Path, *, callback: Callable[[int], None] | None = None) -> None:
        """Upload a local file (multipart when big). ``callback(n)`` reports bytes sent."""

    @abstractmethod
    def get_file(self, key: str, path: str | Path) -> None:
        """Download to ``path`` (written to a temp name first, then renamed)."""

    @abstractmethod
    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every object under the directory-like ``prefix`` (recursive), sorted by key."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; absent keys are not an error."""

    def delete_many(self, keys: list[str]) -> None:
        for key in keys:
            self.delete(key)


# --------------------------------------------------------------------------- file://


class FileStore(Store):
    """A directory on a local (POSIX) filesystem.

    Writes go to a temp file in the target's directory and are renamed into place, so a reader
    never sees half a file. The etag is the sha256 of the content.
    """

    def __init__(self, root: str | Path):
        self.root = Path(root).expanduser().absolute()
        self.uri = self.root.as_uri()

    def _child(self, prefix: str) -> FileStore:
        return FileStore(self.root / prefix)

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def _tmp(self, target: Path) -> Path:
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.parent / f"{_RESERVED}tmp-{target.name}-{secrets.token_hex(6)}"

    @contextlib.contextmanager
    def _locked(self, target: Path) -> Iterator[None]:
        import fcntl

        target.parent.mkdir(parents=True, exist_ok=True)
        lock = target.parent / f"{_RESERVED}lock-{target.name}"
        with open(lock, "a") as fh:
            # flock is released by the kernel if the holder dies: no stale locks to clean up.
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def _etag(data: bytes) -> str:
        return hashlib.sha256(data).hexdigest()

    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        target = self._path(key)
        if if_none_match and if_match is not None:
            raise G2RPOError(problem("if_match", if_match, "use either if_none_match or if_match, not both"))
        try:
            tmp = self._tmp(target)
        except OSError as exc:
            raise write_failure(f"stored object {key!r}", target, exc) from exc
        try:
            try:
                tmp.write_bytes(data)
            except OSError as exc:  # a full disk, a read-only folder: the partial temp file goes (finally)
                raise write_failure(f"stored object {key!r}", target, exc) from exc
            if if_none_match:
                try:
                    os.link(tmp, target)  # atomic create: fails if the name exists
                except FileExistsError:
                    raise WriteConflict(f"{self.uri_for(key)} already exists (create-only write refused)") from None
            elif if_match is not None:
                with self._locked(target):
                    try:
                        current = self._etag(target.read_bytes())
                    except FileNotFoundError:
                        raise WriteConflict(
                            f"{self.uri_for(key)} no longer exists (expected etag {if_match})"
                        ) from None
                    if current != if_match:
                        raise WriteConflict(
                            f"{self.uri_for(key)} changed since it was read (etag {if_match} → {current})"
                        )
                    os.replace(tmp, target)
            else:
                with self._locked(target):
                    os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
        return self._etag(data)

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        path = self._path(key)
        try:
            info = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist") from None
        if stat.S_ISDIR(info.st_mode):
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist")
        if not stat.S_ISREG(info.st_mode):  # checked before opening: a FIFO would block the read
            raise G2RPOError(
                f"{self.uri_for(key)} is {describe_kind(info.st_mode)}, not a stored object: remove it or check the URI"
            )
        _check_size(self.uri_for(key), info.st_size, max_bytes)
        try:
            data = path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist") from None
        _check_size(self.uri_for(key), len(data), max_bytes)  # grew since the stat
        return data, self._etag(data)

    def head(self, key: str) -> ObjectInfo | None:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            return None
        if not path.is_file():
            return None
        modified = datetime.fromtimestamp(st.st_mtime, tz=UTC)
        return ObjectInfo(key=key, size=st.st_size, modified=modified, etag="")

    def put_file(self, key: str, path: str | Path, *, callback: Callable[[int], None] | None = None) -> None:
        target = self._path(key)
        if not Path(path).is_file():
            raise G2RPOError(problem("path", str(path), "local file does not exist"))
        try:
            tmp = self._tmp(target)
        except OSError as exc:
            raise write_failure(f"stored object {key!r}", target, exc) from exc
        try:
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        except OSError as exc:  # a full disk, a read-only folder: the partial temp file goes (finally)
            raise write_failure(f"stored object {key!r}", target, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)
        if callback is not None:
            callback(target.stat().st_size)

    def get_file(self, key: str, path: str | Path) -> None:
        source = self._path(key)
        if not source.is_file():
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist")
        dest = Path(path)
        tmp = dest.parent / f"{_RESERVED}tmp-{dest.name}-{secrets.token_hex(6)}"
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, tmp)
            os.replace(tmp, dest)
        except OSError as exc:  # a full disk, a read-only folder: the partial temp file goes (finally)
            raise write_failure(f"the download of {self.uri_for(key)}", dest, exc) from exc
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        base = self.root / validate_key(prefix, field="prefix", allow_empty=True) if prefix else self.root
        if base.is_file():
            infos = [self.head(prefix)]
            return [i for i in infos if i is not None]
        out = []
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(_RESERVED))
            for name in filenames:
                if name.startswith(_RESERVED):
                    continue
                full = Path(dirpath) / name
                key = full.relative_to(self.root).as_posix()
                info = self.head(key)
                if info is not None:
                    out.append(info)
        return sorted(out, key=lambda i: i.key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        path.unlink(missing_ok=True)
        (path.parent / f"{_RESERVED}lock-{path.name}").unlink(missing_ok=True)
        # Remove directories left empty, up to the root (S3 has no directories either).
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent


# --------------------------------------------------------------------------- s3://


_AUTH_CODES = {"AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId", "InvalidToken", "ExpiredToken"}


def _s3_error(exc: Exception, action: str, uri: str) -> G2RPOError:
    """Turn a boto/botocore exception into a G2RPOError that says what to check."""
    from botocore.exceptions import (
        ClientError,
        NoCredentialsError,
        PartialCredentialsError,
    )
    from botocore.exceptions import (
        ConnectionError as BotoConnectionError,
    )

    if isinstance(exc, (NoCredentialsError, PartialCredentialsError)):
        return G2RPOError(
            f"{action} {uri}: no S3 credentials found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE"
        )
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        if code in _AUTH_CODES or code == "403":
            return G2RPOError(
                f"{action} {uri}: refused by the server ({code}); check the credentials of the AWS chain "
                "(AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE) and the bucket policy"
            )
        if code == "NoSuchBucket":
            return G2RPOError(f"{action} {uri}: the bucket does not exist; create it first or fix the URI")
        meta = exc.response.get("ResponseMetadata", {})
        status = meta.get("HTTPStatusCode") or 0
        if status >= 500:
            # botocore retried it with backoff already: the server keeps failing, the request is fine.
            attempts = int(meta.get("RetryAttempts", 0)) + 1
            message = exc.response.get("Error", {}).get("Message", "")
            return G2RPOError(
                f"{action} {uri}: the S3 server failed on all {attempts} attempt(s) ({code or status}: {message}); "
                "the request is not at fault: check the server's health and its logs (a full store is a common "
                "cause: SeaweedFS logs 'no free volumes left'), then run again"
            )
        return G2RPOError(f"{action} {uri}: S3 error {code}: {exc.response.get('Error', {}).get('Message', exc)}")
    if isinstance(exc, BotoConnectionError):
        return G2RPOError(
            f"{action} {uri}: cannot reach the S3 endpoint after retries ({exc}); check that the server is up "
            "and AWS_ENDPOINT_URL_S3/--endpoint-url"
        )
    return G2RPOError(f"{action} {uri}: {type(exc).__name__}: {exc}")


class S3Store(Store):
    """Objects in an S3 bucket under an optional key prefix (boto3)."""

    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None, client=None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client = make_s3_client(self.settings)
        return self._client

    def _child(self, prefix: str) -> S3Store:
        return S3Store(self.bucket, f"{self.prefix}/{prefix}" if self.prefix else prefix, self.settings, self._client)

    def _key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _rel(self, full: str) -> str:
        return full[len(self.prefix) + 1 :] if self.prefix else full

    def put_bytes(self, key: str, data: bytes, *, if_none_match: bool = False, if_match: str | None = None) -> str:
        from botocore.exceptions import BotoCoreError, ClientError

        if if_none_match and if_match is not None:
            raise G2RPOError(problem("if_match", if_match, "use either if_none_match or if_match, not both"))
        full = self._key(key)
        kwargs = {}
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        try:
            response = self.client.put_object(Bucket=self.bucket, Key=full, Body=data, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                what = "already exists" if if_none_match else f"changed since it was read (expected etag {if_match})"
                raise WriteConflict(f"{self.uri_for(key)} {what}") from None
            raise _s3_error(exc, "writing", self.uri_for(key)) from None
        except BotoCoreError as exc:
            raise _s3_error(exc, "writing", self.uri_for(key)) from None
        return response["ETag"]

    def get_bytes(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=full)
            _check_size(self.uri_for(key), int(response.get("ContentLength", 0)), max_bytes)
            data = response["Body"].read() if max_bytes is None else response["Body"].read(max_bytes + 1)
            _check_size(self.uri_for(key), len(data), max_bytes)
            return data, response["ETag"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise ObjectNotFound(f"{self.uri_for(key)} does not exist") from None
            raise _s3_error(exc, "reading", self.uri_for(key)) from None
        except BotoCoreError as exc:
            raise _s3_error(exc, "reading", self.uri_for(key)) from None

    def head(self, key: str) -> ObjectInfo | None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        try:
            r = self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise _s3_error(exc, "reading", self.uri_for(key)) from None
        except BotoCoreError as exc:
            raise _s3_error(exc, "reading", self.uri_for(key)) from None
        return ObjectInfo(key=key, size=r["ContentLength"], modified=r["LastModified"], etag=r["ETag"])

    def _transfer_config(self, size: int):
        from boto3.s3.transfer import TransferConfig

        s = self.settings
        return TransferConfig(
            multipart_threshold=s.multipart_threshold,
            multipart_chunksize=part_size_for(size, s.min_part_size),
            max_concurrency=s.max_concurrency,
            use_threads=s.max_concurrency > 1,
        )

    def put_file(self, key: str, path: str | Path, *, callback: Callable[[int], None] | None = None) -> None:
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        path = Path(path)
        if not path.is_file():
            raise G2RPOError(problem("path", str(path), "local file does not exist"))
        try:
            self.client.upload_file(
                str(path),
                self.bucket,
                full,
                Config=self._transfer_config(path.stat().st_size),
                Callback=callback,
            )
        except S3UploadFailedError as exc:
            cause = exc.__cause__ or exc.__context__
            detail = _s3_error(cause, "uploading to", self.uri_for(key)) if cause else exc
            raise G2RPOError(f"upload of {path} failed: {detail}") from None
        except (BotoCoreError, ClientError) as exc:
            raise G2RPOError(f"upload of {path} failed: {_s3_error(exc, 'uploading to', self.uri_for(key))}") from None

    def get_file(self, key: str, path: str | Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        info = self.head(key)
        if info is None:
            raise ObjectNotFound(f"{self.uri_for(key)} does not exist")
        dest = Path(path)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.parent / f"{_RESERVED}tmp-{dest.name}-{secrets.token_hex(6)}"
        try:
            self.client.download_file(self.bucket, self._key(key), str(tmp), Config=self._transfer_config(info.size))
            os.replace(tmp, dest)
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, "downloading", self.uri_for(key)) from None
        finally:
            tmp.unlink(missing_ok=True)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = validate_key(prefix, field="prefix", allow_empty=True)
        full = "/".join(p for p in (self.prefix, prefix) if p)
        out = []
        try:
            pages = self.client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=f"{full}/" if full else ""
            )
            for page in pages:
                for obj in page.get("Contents", []):
                    out.append(ObjectInfo(self._rel(obj["Key"]), obj["Size"], obj["LastModified"], obj["ETag"]))
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, "listing", self.uri_for(prefix)) from None
        if not out and prefix:
            info = self.head(prefix)  # a prefix that names one object lists that object
            if info is not None:
                out.append(info)
        return sorted(out, key=lambda i: i.key)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=full)
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, "deleting", self.uri_for(key)) from None

    def incomplete_uploads(self, prefix: str = "") -> list[tuple[str, str, datetime]]:
        """Multipart uploads started under ``prefix`` and never completed: ``(key, upload_id, initiated)``.

        A killed upload leaves its parts on the server (and on the bill) until aborted.
        """
        from botocore.exceptions import BotoCoreError, ClientError

        prefix = validate_key(prefix, field="prefix", allow_empty=True)
        full = "/".join(p for p in (self.prefix, prefix) if p)
        out = []
        try:
            pages = self.client.get_paginator("list_multipart_uploads").paginate(
                Bucket=self.bucket, Prefix=f"{full}/" if full else ""
            )
            for page in pages:
                for upload in page.get("Uploads", []) or []:
                    out.append((self._rel(upload["Key"]), upload["UploadId"], upload["Initiated"]))
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, "listing multipart uploads under", self.uri_for(prefix)) from None
        return out

    def abort_upload(self, key: str, upload_id: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        full = self._key(key)
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except (BotoCoreError, ClientError) as exc:
            raise _s3_error(exc, "aborting the multipart upload of", self.uri_for(key)) from None

    def delete_many(self, keys: list[str]) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        for start in range(0, len(keys), 1000):  # S3's DeleteObjects limit
            batch = [{"Key": self._key(k)} for k in keys[start : start + 1000]]
            try:
                response = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": batch, "Quiet": True})
            except (BotoCoreError, ClientError) as exc:
                raise _s3_error(exc, "deleting under", self.uri) from None
            errors = response.get("Errors", [])
            if errors:
                first = errors[0]
                raise G2RPOError(f"deleting {len(errors)} object(s) under {self.uri} failed, e.g. {first}")


_CLIENTS: dict[tuple, object] = {}


def make_s3_client(settings: S3Settings):
    """A boto3 S3 client: standard credential chain, path-style, botocore retries with backoff.

    Clients are cached per settings and ``AWS_*`` environment (building one costs ~0.1 s); boto3
    clients are thread-safe.
    """
    key = (settings.model_dump_json(), tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))))
    client = _CLIENTS.get(key)
    if client is None:
        client = _CLIENTS[key] = _new_s3_client(settings)
    return client


def _new_s3_client(settings: S3Settings):
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - boto3 is a dependency
        raise ImportError("s3:// needs boto3: pip install boto3") from exc
    config = Config(
        region_name=settings.region,
        s3={"addressing_style": settings.addressing_style},
        retries={"mode": settings.retry_mode, "total_max_attempts": settings.max_attempts},  # first one included
        connect_timeout=settings.connect_timeout,
        read_timeout=settings.read_timeout,
        request_checksum_calculation=settings.checksums,
        response_checksum_validation=settings.checksums,
    )
    session = boto3.session.Session()
    try:
        return session.client("s3", endpoint_url=settings.endpoint_url, config=config)
    except ValueError as exc:  # e.g. AWS_ENDPOINT_URL_S3=127.0.0.1:9000 (no scheme)
        for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
            if os.environ.get(name) and not _is_http_url(os.environ[name]):
                raise G2RPOError(problem(name, os.environ[name], "give a URL like http://127.0.0.1:8333")) from None
        raise G2RPOError(f"cannot create an S3 client: {exc}; check the endpoint and region settings") from None


# --------------------------------------------------------------------------- opening


def open_store(uri: str, settings: S3Settings | None = None) -> Store:
    """The store rooted at ``uri``: a local path, ``file:///path`` or ``s3://bucket[/prefix]``."""
    scheme, where, prefix = _parse(uri)
    if scheme == "s3":
        return S3Store(where, prefix, settings)
    return FileStore(where)


def locate(uri: str, settings: S3Settings | None = None) -> tuple[Store, str]:
    """``(store, key)`` for a URI that names one object: the store is rooted at its parent."""
    scheme, where, prefix = _parse(uri)
    if uri.endswith("/"):
        raise G2RPOError(problem("uri", uri, "names a folder/prefix; name the object itself, e.g. .../prompts.txt"))
    if scheme == "s3":
        if not prefix:
            raise G2RPOError(problem("uri", uri, "name an object inside the bucket: s3://bucket/path/to/object"))
        parent, _, name = prefix.rpartition("/")
        return S3Store(where, parent, settings), name
    path = Path(where).expanduser().absolute()
    name = PurePosixPath(path.as_posix()).name
    if not name:
        raise G2RPOError(problem("uri", uri, "name a file, not the filesystem root"))
    return FileStore(path.parent), validate_key(name, field="uri")
