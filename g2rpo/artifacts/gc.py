"""Garbage collection of publishes that never finished.

:func:`gc` deletes prefixes that have a publish marker but no manifest and have not been written
to for a given age (a crashed or killed upload), never a prefix that holds or is held by a
protected URI (the registry's champion).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from g2rpo.artifacts.manifest import MANIFEST_NAME, MARKER_NAME, _now
from g2rpo.artifacts.storage import S3Settings, S3Store, open_store
from g2rpo.errors import G2RPOError, problem

__all__ = ["gc", "GcReport", "parse_duration"]


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
