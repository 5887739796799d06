"""Verified downloads of published artifacts, the digest-keyed local cache, and verified local folders.

Readers trust only prefixes with a manifest and check every file's sha256 when they download
(:func:`download_dir`, :func:`fetch_to_cache`).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterable
from pathlib import Path

from g2rpo.artifacts.manifest import MANIFEST_NAME, Manifest, parse_manifest, read_manifest, verify
from g2rpo.artifacts.storage import (
    FileStore,
    ObjectNotFound,
    S3Settings,
    Store,
    check_writable,
    open_store,
    sha256_file,
)
from g2rpo.errors import G2RPOError, problem, write_failure
from g2rpo.textfile import JSON_MAX_BYTES, read_json_file, read_regular_file

__all__ = ["CACHE_ENV", "check_cache_writable", "download_dir", "fetch_to_cache", "default_cache_dir", "verify_local"]

CACHE_ENV = "G2RPO_CACHE_DIR"


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
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "g2rpo").expanduser()


def _cache_setting(cache_dir: str | Path | None, setting: str) -> str:
    """The setting that moves the cache: ``setting`` when a cache folder was given, else the variable."""
    if cache_dir is not None:
        return setting
    return CACHE_ENV if os.environ.get(CACHE_ENV) else f"{CACHE_ENV} (unset: the default ~/.cache/g2rpo)"


def check_cache_writable(cache_dir: str | Path | None = None, setting: str = "cache_dir") -> Path:
    """The folder ``s3://`` artifacts are fetched into, refused before any work when it cannot be
    written (a read-only home in a container, a read-only mount), naming the folder and the setting
    that moves it: ``setting`` when ``cache_dir`` is given, else ``$G2RPO_CACHE_DIR``."""
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    check_writable(root, _cache_setting(cache_dir, setting))
    return root


def fetch_to_cache(
    uri: str, cache_dir: str | Path | None = None, settings: S3Settings | None = None, *, setting: str = "cache_dir"
) -> Path:
    """A local folder holding the published artifact at ``uri``, downloaded at most once.

    The cache is keyed by the sha256 of the manifest (which pins every file's digest):
    ``<cache_dir>/artifacts/<manifest sha256>/``. A hit is returned without network traffic beyond
    reading the manifest, after checking every cached file's sha256 (reads every byte once per
    fetch; a damaged entry is reported on stderr, removed and downloaded again); a miss downloads
    into a temp folder, verifies every sha256 and renames it into place (so concurrent fetches
    cannot leave a half-filled entry). Local artifacts
    (``file://`` and plain paths) are returned in place after checking their manifest and sizes.
    A cache folder that cannot be written is refused naming it and the setting that moves it
    (``setting`` when ``cache_dir`` is given, else ``$G2RPO_CACHE_DIR``), as is a write that fails
    on the way (a full disk), with no partial entry left.
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
            check_cache_writable(cache_dir, setting)  # the damaged entry can only be replaced in a writable cache
            _discard(entry)
    check_cache_writable(cache_dir, setting)
    staging = entry.parent / f".g2rpo-dl-{digest[:16]}-{secrets.token_hex(4)}"
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        _download_verified(store, manifest, staging)
        (staging / MANIFEST_NAME).write_bytes(data)  # written last: marks the entry complete
        try:
            os.replace(staging, entry)
        except OSError:
            if not (entry / MANIFEST_NAME).is_file():  # lost a race to an identical download: fine
                raise
    except OSError as exc:
        failure = write_failure(f"the cached copy of {uri}", entry, exc)
        raise G2RPOError(f"{failure} (the cache folder moves with {_cache_setting(cache_dir, setting)})") from exc
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
        return store.get_bytes(MANIFEST_NAME, max_bytes=JSON_MAX_BYTES)
    except ObjectNotFound:
        raise G2RPOError(
            f"{store.uri} has no {MANIFEST_NAME}: the artifact is absent or its upload never finished; "
            "check the URI or publish it again"
        ) from None


# --------------------------------------------------------------------------- verified local folders


def _verified_files(record_path: Path, root: Path, manifest_digest: str) -> dict:
    """The file identities recorded when ``root`` last verified against this manifest. A record that is
    missing, for another manifest or damaged (cut short, not an object, a directory) is read as none: it
    only saves hashing, so the cost of damage there is a re-hash, after which it is written anew."""
    try:
        record = read_json_file(record_path, what="verification record", fix="", max_bytes=JSON_MAX_BYTES)
    except G2RPOError:
        return {}
    files = record.get("files")
    if record.get("manifest") != manifest_digest or record.get("root") != str(root) or not isinstance(files, dict):
        return {}
    return files


def _identity(stat: os.stat_result) -> list[int]:
    """What tells a file's content has not been touched since it was hashed, without reading it: size,
    mtime_ns, inode, device and ctime_ns (ctime cannot be set back by a program, unlike mtime)."""
    return [stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_dev, stat.st_ctime_ns]


def verify_local(
    folder: str | Path,
    only: Iterable[str] | None = None,
    *,
    cache_dir: str | Path | None = None,
    what: str = "artifact",
) -> Manifest | None:
    """Check a local folder's files against its ``manifest.json`` (size and sha256); None when it has none.

    ``only`` limits the check to files whose path starts with one of those top-level names (a
    consumer that loads two components of a model checks those and the top-level files). Hashing
    every byte costs ~1 s per GiB (docs/errors.md: FLUX.1-dev's ~34 GB would take half a minute per load), so a file whose identity (path, size,
    mtime_ns, inode, device, ctime_ns) matches the one recorded when it last verified is not read
    again: the record lives in ``<cache_dir>/verified/<sha256 of the folder's path>.json`` (the
    default cache dir when None) and pins the manifest's digest, so a new manifest verifies anew.
    Raises a G2RPOError listing every mismatch, naming ``what`` the folder is.
    """
    root = Path(folder).absolute()
    if not os.path.lexists(root / MANIFEST_NAME):
        return None
    try:  # a regular file of bounded size (a FIFO is never opened), then UTF-8 JSON of the manifest's schema
        data = read_regular_file(
            root / MANIFEST_NAME,
            what=f"{what}'s manifest",
            max_bytes=JSON_MAX_BYTES,
            fix="restore the folder from its source or make it again",
        )
    except G2RPOError as exc:
        raise G2RPOError(problem(what, str(root), str(exc))) from None
    manifest = parse_manifest(data, str(root / MANIFEST_NAME))
    prefixes = None if only is None else tuple(only)
    entries = [
        e for e in manifest.files if prefixes is None or "/" not in e.path or e.path.split("/", 1)[0] in prefixes
    ]
    record_path = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) / "verified"
    record_path /= hashlib.sha256(str(root).encode()).hexdigest()[:32] + ".json"
    manifest_digest = hashlib.sha256(data).hexdigest()
    known = _verified_files(record_path, root, manifest_digest)
    problems, verified = [], {}
    for entry in entries:
        path = root / entry.path
        try:
            stat = path.stat()
        except OSError:
            problems.append(f"{entry.path}: missing")
            continue
        if stat.st_size != entry.size:
            problems.append(f"{entry.path}: size {stat.st_size}, manifest says {entry.size}")
            continue
        identity = _identity(stat)
        if known.get(entry.path) == identity:
            verified[entry.path] = identity
            continue
        _, digest = sha256_file(path)
        if digest != entry.sha256:
            problems.append(f"{entry.path}: sha256 {digest[:12]}…, manifest says {entry.sha256[:12]}…")
            continue
        verified[entry.path] = identity
    if problems:
        raise G2RPOError(
            f"{what} {str(root)!r} does not match its {MANIFEST_NAME} ({len(problems)} file(s) damaged or changed "
            "since it was written): do not use it; restore the folder from its source or make it again\n  - "
            + "\n  - ".join(problems)
        )
    if verified != {p: known.get(p) for p in verified}:
        try:  # best effort: a read-only cache only costs the next run a re-hash
            record_path.parent.mkdir(parents=True, exist_ok=True)
            merged = {**known, **verified}
            body = json.dumps({"root": str(root), "manifest": manifest_digest, "files": merged}, sort_keys=True)
            tmp = record_path.with_name(f".{record_path.name}.{secrets.token_hex(4)}")
            try:
                tmp.write_text(body, encoding="utf-8")
                os.replace(tmp, record_path)
            finally:
                tmp.unlink(missing_ok=True)
        except OSError:
            pass
    return manifest
