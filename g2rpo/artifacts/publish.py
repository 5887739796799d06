"""Atomic publish of a local folder as an artifact, with a claim on its prefix.

Publishing (:func:`publish_dir`) is atomic without copies (S3 has no rename):

1. write ``_publishing.json`` (a marker naming the producer; it makes the prefix visible to GC),
2. upload every file under the artifact's own prefix (multipart when big),
3. write ``manifest.json`` *last*, create-only (``If-None-Match: *``): an artifact is never
   overwritten, and two writers racing for one prefix cannot both publish,
4. remove the marker.

Readers trust only prefixes with a manifest (:mod:`g2rpo.artifacts.manifest`,
:mod:`g2rpo.artifacts.cache`); :mod:`g2rpo.artifacts.gc` removes prefixes a crashed publish left
with a marker and no manifest.

A publish whose files several processes upload (each node of a multi-node run its part of a
checkpoint: :mod:`g2rpo.training.mirror`) takes the same steps split up: one process claims the
prefix (:func:`claim_prefix`), every process uploads its files, and the claimant, once all are done,
writes the manifest over all of them (:func:`seal_uploaded`).

Use :func:`unique_prefix` to give each publish its own prefix (``name-20261129T150000Z-1a2b3c4d``).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from g2rpo import __version__
from g2rpo.artifacts.cache import verify_local
from g2rpo.artifacts.manifest import (
    MANIFEST_NAME,
    MARKER_NAME,
    FileEntry,
    Manifest,
    _iso,
    _now,
    has_manifest,
    scan_dir,
    write_manifest,
)
from g2rpo.artifacts.storage import (
    ObjectNotFound,
    S3Settings,
    Store,
    WriteConflict,
    _parse,
    open_store,
    validate_key,
)
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import RECORD_MAX_BYTES, decode_json

__all__ = [
    "LEASE_S",
    "PrefixClaim",
    "claim_prefix",
    "pid_alive",
    "process_start",
    "publish_dir",
    "seal_uploaded",
    "unique_prefix",
    "unique_uri",
]

# A publish's claim on its prefix lapses this long after its holder last renewed it (every sixth of
# it, while uploading): long enough for a slow request or a pause, short enough that a retry after a
# crash on another machine waits minutes, not the hour `storage gc` would.
LEASE_S = 120.0
# The claims held by the publishes running in this process (their tokens).
_LIVE_TOKENS: set[str] = set()
_LIVE_LOCK = threading.Lock()


def unique_prefix(name: str) -> str:
    """``name-<UTC timestamp>-<8 hex>``: a fresh prefix per publish (no two writers share one)."""
    validate_key(name, field="name")
    return f"{name}-{_now():%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


def unique_uri(uri: str) -> str:
    """``uri`` with its last segment made unique: ``s3://b/exports/model`` → ``s3://b/exports/model-<t>-<hex>``.

    The URI must name something below its bucket or folder (``s3://bucket`` alone is refused: a
    unique *bucket* name is not what anyone wants).
    """

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


def _listed_files(local_dir: str | Path) -> list[str] | None:
    """The files the folder's own manifest lists, after checking them against it; None without one."""
    manifest = verify_local(local_dir, what="folder to publish")
    return None if manifest is None else [entry.path for entry in manifest.files]


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

    A folder g2rpo wrote or downloaded (an export, a model it made, a fetched artifact) carries its own
    ``manifest.json``: it is verified first (a damaged file is refused, never published) and exactly the
    files it lists are published, under a new manifest.

    The publish claims the prefix first (:func:`_claim`): a live publish to the same prefix refuses this
    one; one whose holder is gone (a dead process, a lease of ``lease_s`` not renewed) is taken over.

    ``uri`` must not hold a published artifact already. On any failure the prefix stays without a
    manifest, so no reader sees it, and :func:`gc` removes it later; calling again with the same
    ``uri`` re-uploads and publishes.
    """
    files = scan_dir(local_dir, _listed_files(local_dir))
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
    return seal_uploaded(claim, files, producer=producer, config_hash=config_hash, metadata=metadata)


def claim_prefix(
    uri: str, *, producer: str, settings: S3Settings | None = None, lease_s: float = LEASE_S
) -> PrefixClaim:
    """Claim ``uri`` for a publish whose files other processes upload (one node's part each, with
    ``store.put_file``): the claim holds off any other publish to the prefix while they do, and
    :func:`seal_uploaded` ends it with the manifest. Refused when ``uri`` is published already."""
    store = open_store(uri, settings)
    if has_manifest(store):
        raise G2RPOError(
            f"{store.uri} is already published; artifacts are immutable: publish under a new prefix (unique_prefix)"
        )
    return _claim(store, producer, lease_s)


def seal_uploaded(
    claim: PrefixClaim,
    files: list[FileEntry],
    *,
    producer: str,
    config_hash: str | None = None,
    metadata: dict | None = None,
) -> Manifest:
    """Publish the files already uploaded under the claimed prefix: check each is there with its size,
    then write the manifest, last and create-only, and release the claim (also when this fails)."""
    store = claim.store
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


# A publish's hold on its prefix, as claim_prefix hands it out.
PrefixClaim = _Claim


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
        "pid_started": process_start(os.getpid()),
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
    where = store.uri_for(MARKER_NAME)
    try:
        data, etag = store.get_bytes(MARKER_NAME, max_bytes=RECORD_MAX_BYTES)
    except ObjectNotFound:  # released between our write and our read: claim it as new
        return store.put_bytes(MARKER_NAME, body, if_none_match=True)
    try:
        holder = decode_json(data, where, fix="claims are written whole, so it was changed or is not g2rpo's")
    except G2RPOError as exc:  # never taken over: nothing says whose it is
        holder, etag = {}, None
        detail = str(exc).removeprefix(where).lstrip(": ")
        who = f"an unknown publisher (its claim {where} is not a JSON object g2rpo can read: {detail})"
    else:
        who = (
            f"{holder.get('producer', '?')} (pid {holder.get('pid', '?')} on {holder.get('host', '?')}, "
            f"started {holder.get('started_at', '?')})"
        )
    gone = _holder_gone(holder) if holder else None
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
    lease = holder.get("lease_s")
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
    started = process_start(pid)
    if not pid_alive(pid):
        return f"process {pid} on this host is gone"
    if started is not None and holder.get("pid_started") not in (None, started):
        return f"process {pid} on this host is gone (the pid belongs to a newer process now)"
    return None


def pid_alive(pid: int) -> bool:
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


def process_start(pid: int) -> str | None:
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
