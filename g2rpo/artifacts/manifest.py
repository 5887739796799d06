"""Artifact manifests: the format, and checking a folder or prefix against it.

An *artifact* is every object under one prefix (a checkpoint, an exported model, an embedding
cache, an eval report). It counts as present only when ``<prefix>/manifest.json`` exists:

    {"schema_version": 1, "producer": "g2rpo.training.trainer 0.1.0", "config_hash": "3f2a...",
     "created_at": "2026-11-29T15:00:00Z", "metadata": {...},
     "files": [{"path": "transformer/model.safetensors", "size": 123, "sha256": "..."}, ...]}

This module holds the format (:class:`Manifest`, :class:`FileEntry`), sealing a local folder
(:func:`write_dir_manifest`) and the checks (:func:`read_manifest`, :func:`mismatches`,
:func:`verify`). The rest of the artifact layer is built on it, one idea a module:

- :mod:`g2rpo.artifacts.publish`: atomic publish (files first, the manifest last and create-only)
  with the claim/lease protocol on the prefix, and :func:`~g2rpo.artifacts.publish.unique_prefix`;
- :mod:`g2rpo.artifacts.cache`: verified downloads and the digest-keyed cache;
- :mod:`g2rpo.artifacts.gc`: garbage collection of publishes that never finished.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from g2rpo.artifacts.storage import (
    FileStore,
    ObjectNotFound,
    Store,
    WriteConflict,
    sha256_file,
    validate_key,
)
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import JSON_MAX_BYTES, decode_json

__all__ = [
    "SCHEMA_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "FileEntry",
    "Manifest",
    "scan_dir",
    "write_manifest",
    "write_dir_manifest",
    "parse_manifest",
    "read_manifest",
    "has_manifest",
    "verify",
    "mismatches",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
# The claim a publish in progress writes on its prefix (g2rpo.artifacts.publish); reserved here
# because no artifact may hold a file of that name.
MARKER_NAME = "_publishing.json"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class FileEntry(BaseModel):
    """One file of an artifact: its key relative to the artifact's prefix, size and sha256."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    path: str = Field(description="key relative to the artifact prefix, '/'-separated")
    size: int = Field(ge=0, description="bytes")
    sha256: str = Field(pattern=_SHA256.pattern, description="hex sha256 of the content")


class Manifest(BaseModel):
    """What an artifact holds and who made it. Written last; its presence means 'complete'."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(SCHEMA_VERSION, description="manifest format version")
    producer: str = Field(description="what wrote the artifact, e.g. 'g2rpo.training.trainer 0.1.0'")
    config_hash: str | None = Field(None, description="g2rpo.config.config_hash of the producing config")
    created_at: str = Field(description="UTC time of publishing, ISO 8601")
    files: list[FileEntry] = Field(description="every file of the artifact (the manifest itself excluded)")
    metadata: dict = Field(default_factory=dict, description="free-form, JSON-serialisable extras")

    def to_bytes(self) -> bytes:
        return (json.dumps(self.model_dump(mode="json"), indent=1, sort_keys=True) + "\n").encode()

    @property
    def total_size(self) -> int:
        return sum(f.size for f in self.files)


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# --------------------------------------------------------------------------- writing


def scan_dir(local_dir: str | Path, names: Iterable[str] | None = None) -> list[FileEntry]:
    """A :class:`FileEntry` for every regular file under ``local_dir`` (sorted, digests computed).

    ``names`` (paths relative to ``local_dir``) limits the list to those files, for a writer that
    shares its folder with files that are not part of the artifact.
    """
    root = Path(local_dir)
    if not root.is_dir():
        raise G2RPOError(problem("local_dir", str(local_dir), "not a directory; pass the folder to publish"))
    if names is None:
        paths = sorted(p for p in root.rglob("*") if p.is_file())
    else:
        paths = sorted(root / name for name in names)
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise G2RPOError(problem("names", missing[0], f"not a file under {root}; list only files the artifact has"))
    entries = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST_NAME or rel == MARKER_NAME:
            raise G2RPOError(problem("local_dir", str(path), f"{rel!r} is reserved for g2rpo; rename the file"))
        validate_key(rel, field="file")
        size, digest = sha256_file(path)
        entries.append(FileEntry(path=rel, size=size, sha256=digest))
    if not entries:
        raise G2RPOError(problem("local_dir", str(local_dir), "is empty; there is nothing to publish"))
    return entries


def write_manifest(
    store: Store,
    prefix: str,
    files: list[FileEntry],
    producer: str,
    config_hash: str | None = None,
    metadata: dict | None = None,
) -> Manifest:
    """Write ``<prefix>/manifest.json`` create-only; raises if the artifact already has one."""
    manifest = Manifest(
        producer=producer, config_hash=config_hash, created_at=_iso(_now()), files=files, metadata=metadata or {}
    )
    key = f"{prefix}/{MANIFEST_NAME}" if prefix else MANIFEST_NAME
    try:
        store.put_bytes(key, manifest.to_bytes(), if_none_match=True)
    except WriteConflict:
        raise G2RPOError(
            f"{store.uri_for(prefix)} is already published (it has a {MANIFEST_NAME}); artifacts are immutable: "
            "publish under a new prefix (see unique_prefix)"
        ) from None
    return manifest


def write_dir_manifest(
    local_dir: str | Path,
    *,
    producer: str,
    config_hash: str | None = None,
    metadata: dict | None = None,
    names: Iterable[str] | None = None,
) -> Manifest:
    """Seal a local folder as an artifact: its files (all, or ``names``) with size and sha256 in
    ``manifest.json``, written last and create-only, so the manifest's presence means "complete".
    """
    store = FileStore(local_dir)
    if has_manifest(store):
        raise G2RPOError(
            f"{store.uri} is already published (it has a {MANIFEST_NAME}); artifacts are immutable: "
            "write to a new folder, or remove the old manifest first when replacing the folder's contents"
        )
    return write_manifest(store, "", scan_dir(local_dir, names), producer, config_hash=config_hash, metadata=metadata)


def _manifest_key(prefix: str) -> str:
    return f"{prefix}/{MANIFEST_NAME}" if prefix else MANIFEST_NAME


def parse_manifest(data: bytes, where: str) -> Manifest:
    """The manifest in ``data`` (read from ``where``): UTF-8 JSON, one object (:func:`decode_json`), of a
    schema this g2rpo reads; a G2RPOError naming ``where`` and what is wrong otherwise."""
    raw = decode_json(data, where, fix="the artifact is corrupt: republish it")
    version = raw.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise G2RPOError(
            f"{where} has schema_version {version}, newer than this g2rpo reads ({SCHEMA_VERSION}): upgrade g2rpo"
        )
    try:
        return Manifest.model_validate(raw)
    except ValidationError as exc:
        raise G2RPOError(
            f"{where} is not a valid manifest: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
        ) from None


def read_manifest(store: Store, prefix: str = "") -> Manifest:
    """The manifest of the artifact at ``prefix``; raises if the artifact is absent or incomplete."""
    try:
        data, _ = store.get_bytes(_manifest_key(prefix), max_bytes=JSON_MAX_BYTES)
    except ObjectNotFound:
        raise G2RPOError(
            f"{store.uri_for(prefix)} has no {MANIFEST_NAME}: the artifact is absent or its upload never finished; "
            "check the URI or publish it again"
        ) from None
    return parse_manifest(data, store.uri_for(_manifest_key(prefix)))


def has_manifest(store: Store, prefix: str = "") -> bool:
    return store.exists(_manifest_key(prefix))


def mismatches(store: Store, manifest: Manifest, prefix: str = "", deep: bool = False) -> list[str]:
    """One line per file of ``manifest`` that is missing or has another size (``deep``: or sha256)."""
    problems = []
    for entry in manifest.files:
        key = f"{prefix}/{entry.path}" if prefix else entry.path
        info = store.head(key)
        if info is None:
            problems.append(f"{entry.path}: missing")
            continue
        if info.size != entry.size:
            problems.append(f"{entry.path}: size {info.size}, manifest says {entry.size}")
            continue
        if deep:
            digest = _digest_of(store, key)
            if digest != entry.sha256:
                problems.append(f"{entry.path}: sha256 {digest[:12]}…, manifest says {entry.sha256[:12]}…")
    return problems


def verify(store: Store, prefix: str = "", deep: bool = False) -> Manifest:
    """Check that every file of the manifest is there with its size (``deep``: and its sha256).

    Raises a G2RPOError listing every mismatch at once.
    """
    manifest = read_manifest(store, prefix)
    problems = mismatches(store, manifest, prefix, deep)
    if problems:
        raise G2RPOError(f"{store.uri_for(prefix)} does not match its manifest:\n  - " + "\n  - ".join(problems))
    return manifest


def _digest_of(store: Store, key: str) -> str:
    if isinstance(store, FileStore):
        return sha256_file(store.root / key)[1]

    with tempfile.TemporaryDirectory() as tmp:
        store.get_file(key, Path(tmp) / "blob")
        return sha256_file(Path(tmp) / "blob")[1]
