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
import threading
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
    "LEASE_S",
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
# A publish's claim on its prefix lapses this long after its holder last renewed it (every sixth of
# it, while uploading): long enough for a slow request or a pause, short enough that a retry after a
# crash on another machine waits minutes, not the hour `storage gc` would.
LEASE_S = 120.0
# The claims held by the publishes running in this process (their tokens).
_LIVE_TOKENS: set[str] = set()
_LIVE_LOCK = threading.Lock()
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
    lease_s: float = LEASE_S,
) -> Manifest:
    """Upload every file of ``local_dir`` under ``uri`` and publish it (manifest last).

    The publish claims the prefix first (:func:`_claim`): a live publish to the same prefix refuses this
    one; one whose holder is gone (a dead process, a lease of ``lease_s`` not renewed) is taken over.

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
    claim = _claim(store, producer, lease_s)
    root = Path(local_dir)
    try:
        for entry in files:
            claim.check()
            store.put_file(entry.path, root / entry.path)
    except G2RPOError as exc:
        if claim.lost.is_set():  # another publish owns the prefix now: leave its claim alone
            claim.end(release=False)
            raise
        released = claim.end(release=True)
        retry = (
            "run the same publish again to retry"
            if released
            else f"its claim {MARKER_NAME} is still there; the same publish run again takes it over (this "
            f"process's claim, or its lease of {lease_s:g} s lapsed), or `g2rpo storage gc {store.uri} "
            "--older-than 0s` removes the leftovers once you are sure no publish is running"
        )
        raise G2RPOError(f"{exc}\nnothing was published at {store.uri} (no {MANIFEST_NAME}); {retry}") from None
    except BaseException:
        claim.end(release=True)
        raise
    # A manifest must never name a file that is not there: re-check every size before writing it
    # (one HEAD per file), in case a GC with too short an --older-than or another writer got in.
    changed = [e.path for e in files if (info := store.head(e.path)) is None or info.size != e.size]
    if changed:
        claim.end(release=True)
        raise G2RPOError(
            f"{len(changed)} file(s) under {store.uri} vanished or changed during the publish (e.g. {changed[0]}): "
            f"another writer or a `g2rpo storage gc` with a shorter --older-than than the upload took; nothing was "
            "published: run the same publish again"
        )
    try:
        claim.check()
        manifest = write_manifest(store, "", files, producer, config_hash, metadata)
    except BaseException:
        claim.end(release=True)
        raise
    claim.end(release=True)
    return manifest


@dataclass
class _Claim:
    """This publish's hold on its prefix: the marker as last written, its etag, and the renewal thread."""

    store: Store
    marker: dict
    etag: str
    lost: threading.Event = field(default_factory=threading.Event)  # another publish took the claim over
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def renew_until_stopped(self) -> None:
        """Rewrite the marker with a fresh ``renewed_at`` every sixth of the lease, only if it is still ours
        (``If-Match`` on the etag this publish last wrote)."""
        while not self.stop.wait(float(self.marker["lease_s"]) / 6):
            marker = {**self.marker, "renewed_at": _lease_time(_now())}
            try:
                self.etag = self.store.put_bytes(MARKER_NAME, json.dumps(marker).encode(), if_match=self.etag)
            except WriteConflict:
                self.lost.set()
                return
            except G2RPOError:
                continue  # the store is unreachable: the upload itself fails and says so

    def check(self) -> None:
        if self.lost.is_set():
            raise G2RPOError(
                f"{self.store.uri}: another publish took this one's claim over (its lease of {self.marker['lease_s']:g} s "
                "was not renewed in time; the store was unreachable or this process stalled): nothing was published "
                "by this one; the other publish owns the prefix"
            )

    def end(self, release: bool) -> bool:
        """Stop renewing; with ``release`` remove the marker (not when another publish holds it now).
        False when the marker could not be removed (e.g. the server died)."""
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        with _LIVE_LOCK:
            _LIVE_TOKENS.discard(self.marker["token"])
        if not release or self.lost.is_set():
            return not release
        try:
            self.store.delete(MARKER_NAME)
            return True
        except G2RPOError:
            return False


def _claim(store: Store, producer: str, lease_s: float) -> _Claim:
    """Claim the prefix for this publish: the marker is written create-only (``If-None-Match: *``),
    the registry's mechanism, so a second publish to the same prefix is refused before it uploads a
    byte (its files would otherwise mix with the first's).

    The marker names its holder (host, pid, the process's start time, a token of this publish) and
    carries a lease that a thread renews while the upload runs. A claim whose holder is gone — a dead
    process on this host, a publish of this process that has ended, or a lease not renewed within its
    period on any host — is taken over (``If-Match`` on the marker read, so of two retries one wins),
    and the takeover is logged. A live publisher renews its lease and is never taken over."""
    token = secrets.token_hex(8)
    now = _now()
    marker = {
        "producer": producer,
        "started_at": _iso(now),
        "renewed_at": _lease_time(now),
        "lease_s": float(lease_s),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_started": _process_start(os.getpid()),
        "token": token,
    }
    body = json.dumps(marker).encode()
    with _LIVE_LOCK:
        _LIVE_TOKENS.add(token)
    try:
        try:
            etag = store.put_bytes(MARKER_NAME, body, if_none_match=True)
        except WriteConflict:
            etag = _take_over(store, body)
    except BaseException:
        with _LIVE_LOCK:
            _LIVE_TOKENS.discard(token)
        raise
    claim = _Claim(store, marker, etag)
    claim.thread = threading.Thread(target=claim.renew_until_stopped, name="g2rpo-publish-lease", daemon=True)
    claim.thread.start()
    return claim


def _take_over(store: Store, body: bytes) -> str:
    """Replace a claim whose holder is gone (logged); refuse, naming the holder, a claim that may be live."""
    try:
        data, etag = store.get_bytes(MARKER_NAME)
        holder = json.loads(data)
    except ObjectNotFound:  # released between our write and our read: claim it as new
        return store.put_bytes(MARKER_NAME, body, if_none_match=True)
    except ValueError:
        holder, etag = {}, None
    who = (
        f"{holder.get('producer', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
        f"started {holder.get('started_at', '?')})"
    )
    gone = _holder_gone(holder) if isinstance(holder, dict) else None
    if gone is not None and etag is not None:
        try:
            new_etag = store.put_bytes(MARKER_NAME, body, if_match=etag)
        except (WriteConflict, ObjectNotFound):
            # Another retry took the claim over between our read and our write: that holder is live,
            # so this one is refused below like any live claim.
            new_etag = None
        if new_etag is not None:
            print(f"g2rpo: {store.uri}: taking over the publish claim of {who}: {gone}", file=sys.stderr, flush=True)
            return new_etag
    lease = holder.get("lease_s") if isinstance(holder, dict) else None
    lapse = (
        f"if that publish died on another machine, its claim lapses {float(lease):g} s after its last renewal "
        f"({holder.get('renewed_at', '?')}) and the same command then takes it over, or `g2rpo storage gc "
        f"{store.uri} --older-than 0s` removes its leftovers at once"
        if isinstance(lease, (int, float))
        else f"if that publish died, `g2rpo storage gc {store.uri} --older-than 0s` removes its leftovers"
    )
    raise G2RPOError(
        f"{store.uri} is being published by {who}: two publishes to one prefix would mix their files. "
        f"Publish under a fresh prefix (unique_prefix / `storage put --unique`); {lapse}"
    ) from None


def _holder_gone(holder: dict) -> str | None:
    """Why a claim's holder is gone, or None while it may be alive."""
    lease = holder.get("lease_s")
    renewed = _parse_time(holder.get("renewed_at"))
    if isinstance(lease, (int, float)) and renewed is not None:
        age = (_now() - renewed).total_seconds()
        if age > lease:
            return f"its lease was last renewed {age:.0f} s ago ({holder['renewed_at']}; lease {lease:g} s)"
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return None  # another machine's process: only its lease can tell
    if pid == os.getpid():
        with _LIVE_LOCK:
            live = holder.get("token") in _LIVE_TOKENS
        return None if live else "its publish in this process has ended"
    started = _process_start(pid)
    if not _pid_alive(pid):
        return f"process {pid} on this host is gone"
    if started is not None and holder.get("pid_started") not in (None, started):
        return f"process {pid} on this host is gone (the pid belongs to a newer process now)"
    return None


def _pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a running (not zombie) process on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), which tells a reused
    pid apart; None where /proc is not there."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[19]
    except (OSError, IndexError):
        return None


def _lease_time(t: datetime) -> str:
    """A lease's timestamp, in milliseconds: whole seconds would blur a short lease by one."""
    return t.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_time(text: object) -> datetime | None:
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


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
