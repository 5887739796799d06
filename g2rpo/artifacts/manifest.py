"""Artifact manifests: atomic publish, verified download, a digest-keyed cache, and GC.

An *artifact* is every object under one prefix (a checkpoint, an exported model, an embedding
cache, an eval report). It counts as present only when ``<prefix>/manifest.json`` exists:

    {"schema_version": 1, "producer": "g2rpo.training.trainer 0.1.0", "config_hash": "3f2a...",
     "created_at": "2026-11-29T15:00:00Z", "metadata": {...},
     "files": [{"path": "transformer/model.safetensors", "size": 123, "sha256": "..."}, ...]}

Publishing (:func:`publish_dir`) is atomic without copies (S3 has no rename):

1. write ``_publishing.json`` (a marker naming the producer; it makes the prefix visible to GC),
2. upload every file under the artifact's own prefix (multipart when big),
3. write ``manifest.json`` *last*, create-only (``If-None-Match: *``): an artifact is never
   overwritten, and two writers racing for one prefix cannot both publish,
4. remove the marker.

Readers trust only prefixes with a manifest and check every file's sha256 when they download
(:func:`download_dir`, :func:`fetch_to_cache`). :func:`gc` deletes prefixes that have a marker but
no manifest and have not been written to for a given age (a crashed or killed upload), never a
prefix that holds or is held by a protected URI (the registry's champion).

Use :func:`unique_prefix` to give each publish its own prefix (``name-20261129T150000Z-1a2b3c4d``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from g2rpo import __version__
from g2rpo.artifacts.storage import (
    FileStore,
    ObjectNotFound,
    S3Settings,
    S3Store,
    Store,
    WriteConflict,
    open_store,
    sha256_file,
    validate_key,
)
from g2rpo.errors import G2RPOError, problem

__all__ = [
    "SCHEMA_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "FileEntry",
    "Manifest",
    "scan_dir",
    "write_manifest",
    "write_dir_manifest",
    "read_manifest",
    "has_manifest",
    "verify",
    "mismatches",
    "publish_dir",
    "download_dir",
    "fetch_to_cache",
    "default_cache_dir",
    "unique_prefix",
    "unique_uri",
    "parse_duration",
    "gc",
    "GcReport",
]

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
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


def unique_prefix(name: str) -> str:
    """``name-<UTC timestamp>-<8 hex>``: a fresh prefix per publish (no two writers share one)."""
    validate_key(name, field="name")
    return f"{name}-{_now():%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def unique_uri(uri: str) -> str:
    """``uri`` with its last segment made unique: ``s3://b/exports/model`` → ``s3://b/exports/model-<t>-<hex>``.

    The URI must name something below its bucket or folder (``s3://bucket`` alone is refused: a
    unique *bucket* name is not what anyone wants).
    """
    from g2rpo.artifacts.storage import _parse

    scheme, where, prefix = _parse(uri)
    if scheme == "s3":
        if not prefix:
            raise G2RPOError(problem("uri", uri, "name the artifact below the bucket, e.g. s3://bucket/exports/model"))
        parent, _, name = prefix.rpartition("/")
        return f"s3://{where}/{parent + '/' if parent else ''}{unique_prefix(name)}"
    path = Path(where).expanduser().absolute()
    if not path.name:
        raise G2RPOError(problem("uri", uri, "name the artifact folder, e.g. artifacts/model"))
    return str(path.parent / unique_prefix(path.name))


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
    try:
        raw = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise G2RPOError(f"{where} is not valid JSON ({exc}); the artifact is corrupt: republish it") from None
    version = raw.get("schema_version") if isinstance(raw, dict) else None
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
        data, _ = store.get_bytes(_manifest_key(prefix))
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
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        store.get_file(key, Path(tmp) / "blob")
        return sha256_file(Path(tmp) / "blob")[1]


def publish_dir(
    local_dir: str | Path,
    uri: str,
    *,
    producer: str = f"g2rpo {__version__}",
    config_hash: str | None = None,
    metadata: dict | None = None,
    settings: S3Settings | None = None,
) -> Manifest:
    """Upload every file of ``local_dir`` under ``uri`` and publish it (manifest last).

    ``uri`` must not hold a published artifact already. On any failure the prefix stays without a
    manifest, so no reader sees it, and :func:`gc` removes it later; calling again with the same
    ``uri`` re-uploads and publishes.
    """
    files = scan_dir(local_dir)
    store = open_store(uri, settings)
    if has_manifest(store):
        raise G2RPOError(
            f"{store.uri} is already published; artifacts are immutable: publish under a new prefix (unique_prefix)"
        )
    _claim(store, producer)
    root = Path(local_dir)
    try:
        for entry in files:
            store.put_file(entry.path, root / entry.path)
    except G2RPOError as exc:
        released = _release_claim(store)
        retry = (
            "run the same publish again to retry"
            if released
            else f"its claim {MARKER_NAME} is still there: `g2rpo storage gc {store.uri} --older-than 0s` removes "
            "the leftovers once you are sure no publish is running, then run the same publish again"
        )
        raise G2RPOError(f"{exc}\nnothing was published at {store.uri} (no {MANIFEST_NAME}); {retry}") from None
    # A manifest must never name a file that is not there: re-check every size before writing it
    # (one HEAD per file), in case a GC with too short an --older-than or another writer got in.
    changed = [e.path for e in files if (info := store.head(e.path)) is None or info.size != e.size]
    if changed:
        _release_claim(store)
        raise G2RPOError(
            f"{len(changed)} file(s) under {store.uri} vanished or changed during the publish (e.g. {changed[0]}): "
            f"another writer or a `g2rpo storage gc` with a shorter --older-than than the upload took; nothing was "
            "published: run the same publish again"
        )
    manifest = write_manifest(store, "", files, producer, config_hash, metadata)
    store.delete(MARKER_NAME)
    return manifest


def _claim(store: Store, producer: str) -> None:
    """Claim the prefix for this publish: the marker is written create-only (``If-None-Match: *``),
    the registry's mechanism, so a second publish to the same prefix is refused before it uploads a
    byte (its files would otherwise mix with the first's)."""
    marker = {"producer": producer, "started_at": _iso(_now()), "pid": os.getpid(), "host": socket.gethostname()}
    try:
        store.put_bytes(MARKER_NAME, json.dumps(marker).encode(), if_none_match=True)
    except WriteConflict:
        try:
            holder = json.loads(store.get_bytes(MARKER_NAME)[0])
            who = (
                f"{holder.get('producer', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
                f"started {holder.get('started_at', '?')})"
            )
        except (ObjectNotFound, ValueError):
            who = "another publish"
        raise G2RPOError(
            f"{store.uri} is being published by {who}: two publishes to one prefix would mix their files. "
            "Publish under a fresh prefix (unique_prefix / `storage put --unique`); if that publish died, "
            f"`g2rpo storage gc {store.uri} --older-than 1h` removes its leftovers once they are that old"
        ) from None


def _release_claim(store: Store) -> bool:
    """Remove this publish's marker after a failed upload so the same call can be retried (best effort:
    False when the store cannot be reached, e.g. the server died)."""
    try:
        store.delete(MARKER_NAME)
        return True
    except G2RPOError:
        return False


# --------------------------------------------------------------------------- reading


def download_dir(uri: str, local_dir: str | Path, settings: S3Settings | None = None) -> Manifest:
    """Download a published artifact into ``local_dir`` and check every file's size and sha256.

    Files are written to a temp folder beside ``local_dir`` and moved in when all are verified, so
    ``local_dir`` never holds a partial artifact. ``local_dir`` must not exist yet.
    """
    store = open_store(uri, settings)
    manifest = read_manifest(store)
    dest = Path(local_dir)
    if dest.exists():
        raise G2RPOError(problem("local_dir", str(dest), "already exists; choose a new folder or remove it"))
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = dest.parent / f".g2rpo-dl-{dest.name}-{secrets.token_hex(4)}"
    try:
        _download_verified(store, manifest, staging)
        (staging / MANIFEST_NAME).write_bytes(manifest.to_bytes())
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _download_verified(store: Store, manifest: Manifest, staging: Path) -> None:
    for entry in manifest.files:
        target = staging / entry.path
        store.get_file(entry.path, target)
        size, digest = sha256_file(target)
        if size != entry.size or digest != entry.sha256:
            raise G2RPOError(
                f"{store.uri_for(entry.path)}: downloaded {size} bytes with sha256 {digest[:12]}…, the manifest says "
                f"{entry.size} bytes with sha256 {entry.sha256[:12]}…; the artifact was changed after publishing: "
                "republish it"
            )


def default_cache_dir() -> Path:
    """``$G2RPO_CACHE_DIR`` or ``~/.cache/g2rpo``."""
    return Path(os.environ.get("G2RPO_CACHE_DIR") or Path.home() / ".cache" / "g2rpo").expanduser()


def fetch_to_cache(uri: str, cache_dir: str | Path | None = None, settings: S3Settings | None = None) -> Path:
    """A local folder holding the published artifact at ``uri``, downloaded at most once.

    The cache is keyed by the sha256 of the manifest (which pins every file's digest):
    ``<cache_dir>/artifacts/<manifest sha256>/``. A hit is returned without network traffic beyond
    reading the manifest, after checking every cached file's sha256 (reads every byte once per
    fetch; a damaged entry is reported on stderr, removed and downloaded again); a miss downloads
    into a temp folder, verifies every sha256 and renames it into place (so concurrent fetches
    cannot leave a half-filled entry). Local artifacts
    (``file://`` and plain paths) are returned in place after checking their manifest and sizes.
    """
    store = open_store(uri, settings)
    if isinstance(store, FileStore):
        verify(store)
        return store.root
    data, _ = _get_manifest_bytes(store)
    manifest = parse_manifest(data, store.uri_for(MANIFEST_NAME))
    digest = hashlib.sha256(data).hexdigest()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    entry = root / "artifacts" / digest
    if (entry / MANIFEST_NAME).is_file():
        try:
            verify(FileStore(entry), deep=True)
            return entry
        except G2RPOError as exc:  # damaged on this disk since it was downloaded: the remote copy is the source
            print(
                f"g2rpo: cached copy of {uri} does not match its manifest ({' '.join(str(exc).split())}); "
                "downloading it again",
                file=sys.stderr,
                flush=True,
            )
            _discard(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    staging = entry.parent / f".g2rpo-dl-{digest[:16]}-{secrets.token_hex(4)}"
    try:
        _download_verified(store, manifest, staging)
        (staging / MANIFEST_NAME).write_bytes(data)  # written last: marks the entry complete
        try:
            os.replace(staging, entry)
        except OSError:
            if not (entry / MANIFEST_NAME).is_file():  # lost a race to an identical download: fine
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def _discard(entry: Path) -> None:
    """Remove a cache entry: renamed first, so no reader meets it half-deleted (another process may race us)."""
    doomed = entry.parent / f".g2rpo-rm-{entry.name[:16]}-{secrets.token_hex(4)}"
    try:
        os.replace(entry, doomed)
    except FileNotFoundError:  # another process discarded it first
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _get_manifest_bytes(store: Store) -> tuple[bytes, str]:
    try:
        return store.get_bytes(MANIFEST_NAME)
    except ObjectNotFound:
        raise G2RPOError(
            f"{store.uri} has no {MANIFEST_NAME}: the artifact is absent or its upload never finished; "
            "check the URI or publish it again"
        ) from None


# --------------------------------------------------------------------------- garbage collection


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(text: str, field: str = "--older-than") -> timedelta:
    """``'90s' | '30m' | '12h' | '7d' | '2w'`` → timedelta."""
    match = _DURATION.match(str(text))
    if not match:
        raise G2RPOError(problem(field, text, "write a number and a unit: 90s, 30m, 12h, 7d or 2w"))
    return timedelta(seconds=float(match.group(1)) * _UNIT_SECONDS[match.group(2)])


@dataclass
class GcReport:
    """What :func:`gc` found: incomplete prefixes removed (or that would be), and those kept."""

    removed: list[str] = field(default_factory=list)
    kept_recent: list[str] = field(default_factory=list)
    kept_protected: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    uploads_aborted: list[str] = field(default_factory=list)


def _related(a: str, b: str) -> bool:
    """True when one key prefix equals or contains the other."""
    return a == b or a.startswith(b + "/") or b.startswith(a + "/") or a == "" or b == ""


def gc(
    uri: str,
    older_than: timedelta,
    *,
    protected: list[str] = (),
    dry_run: bool = False,
    now: datetime | None = None,
    settings: S3Settings | None = None,
) -> GcReport:
    """Delete unpublished artifact prefixes under ``uri`` whose newest object is older than ``older_than``.

    An unpublished prefix has the publish marker but no manifest; a multipart upload in flight
    under it counts as a write at its start time. On S3 it also aborts multipart uploads under
    ``uri`` started before the cutoff, except those of a prefix kept as recent. ``protected`` URIs
    (e.g. the registry's champions) are never touched, nor any prefix that contains or lies inside
    one. Published artifacts and objects outside artifact prefixes are never deleted.
    """
    if older_than < timedelta(0):
        raise G2RPOError(problem("older_than", str(older_than), "must not be negative"))
    store = open_store(uri, settings)
    now = now or _now()
    protected_keys = []
    for p in protected:
        p = open_store(p, settings).uri  # plain paths and file:// URIs compare alike
        if p == store.uri or p.startswith(store.uri.rstrip("/") + "/"):
            protected_keys.append(p[len(store.uri) :].strip("/"))
        elif store.uri.startswith(p.rstrip("/") + "/"):
            protected_keys.append("")  # the whole GC root lies inside a protected artifact
    objects = store.list()
    # Multipart uploads in flight (or killed) are invisible to listings; they count as writes to
    # their prefix, so a publish still uploading a big file is not collected under its feet.
    uploads = store.incomplete_uploads() if isinstance(store, S3Store) else []
    prefixes = sorted(
        {o.key[: -len(MARKER_NAME)].rstrip("/") for o in objects if o.key.rsplit("/", 1)[-1] == MARKER_NAME}
    )
    published = {o.key[: -len(MANIFEST_NAME)].rstrip("/") for o in objects if o.key.rsplit("/", 1)[-1] == MANIFEST_NAME}
    report = GcReport()
    recent: list[str] = []
    for prefix in prefixes:
        if prefix in published:
            continue  # finished but the marker's removal failed: a published artifact
        members = [o for o in objects if prefix == "" or o.key.startswith(prefix + "/")]
        # Keep everything that belongs to a published artifact nested below (never expected, but safe).
        members = [o for o in members if not any(_related(o.key, p) and p != prefix for p in published if p)]
        where = store.uri_for(prefix) if prefix else store.uri
        if any(_related(prefix, p) for p in protected_keys):
            report.kept_protected.append(where)
            continue
        newest = max(
            [o.modified for o in members] + [t for k, _, t in uploads if prefix == "" or k.startswith(prefix + "/")]
        )
        if now - newest < older_than:
            report.kept_recent.append(where)
            recent.append(prefix)
            continue
        report.removed.append(where)
        report.bytes_freed += sum(o.size for o in members)
        if not dry_run:
            store.delete_many([o.key for o in members])
    if isinstance(store, S3Store):
        # Parts of multipart uploads that were never completed (a killed upload) are invisible to
        # listings but still stored: abort those older than the cutoff.
        for key, upload_id, initiated in uploads:
            if now - initiated < older_than or any(_related(key, p) for p in [*protected_keys, *recent]):
                continue
            report.uploads_aborted.append(store.uri_for(key))
            if not dry_run:
                store.abort_upload(key, upload_id)
    return report
