"""Whose files are in ``output.dir``: a run's folder is marked, and nothing else in a folder is touched.

A fresh run writes :data:`MARKER` (``.g2rpo-run.json``: the g2rpo version, the config hash and
when) into ``output.dir`` before any other file, so the ``config.yaml``, ``metrics.jsonl``,
``checkpoints/`` and ``export/`` beside it are known to be the run's. The trainer writes only into
a folder that is

- new, or empty;
- marked (a g2rpo run's, resumed or restarted there); or
- unmarked but g2rpo's own: a ``checkpoints/`` folder holding only checkpoint directories (what a
  restore from a mirrored checkpoint URI puts in a fresh folder), and — when at least one of them
  is complete — the files a run made before the marker existed (``config.yaml``, ``metrics.jsonl``,
  ``export/``, ...). Such a folder is adopted: the marker is added and the run resumes there.

Anything else — a user's own ``config.yaml`` next to the output, another tool's ``metrics.jsonl`` —
is refused before any work starts, naming the files, so that no file of the user's is ever
overwritten or appended to. (A pre-marker folder of a run killed before its first checkpoint is
refused too: it cannot be told apart from someone else's, and it holds nothing to resume.)

One writer per folder: :func:`claim_run_dir` also takes the writer claim :data:`WRITER` (created
exclusively, naming the holder's host, pid, process start time and when it started, with a lease
that a thread renews while the run lives) and returns it; a second ``g2rpo train`` on the same
folder is refused, naming the holder and what to do. A claim whose holder is gone — a dead process
on this host (or its pid reused by a newer one), or a lease not renewed in time, for a holder on
another machine of a shared volume — is taken over, and the takeover is logged, as the publish
claims of :mod:`g2rpo.artifacts.manifest` are. The claim is released when the run ends.

:class:`RunDir` is the folder resolved once from the config (:meth:`RunDir.of`, by the train step or
the trainer) and handed on: where each of the run's files lives, and its check and claim. Nothing
downstream re-derives a path from ``output.dir``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import sys
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from g2rpo import __version__
from g2rpo.artifacts.publish import pid_alive, process_start
from g2rpo.artifacts.storage import check_writable
from g2rpo.errors import G2RPOError, problem
from g2rpo.textfile import RECORD_MAX_BYTES, describe_kind, read_json_file
from g2rpo.training.checkpoint import is_complete
from g2rpo.training.run_config import RunConfig

__all__ = ["MARKER", "WRITER", "RunDir", "WriterClaim", "check_run_dir", "claim_run_dir", "foreign_entries"]

MARKER = ".g2rpo-run.json"
WRITER = ".g2rpo-writer.json"  # the live run's claim (one writer per folder)
WRITER_LEASE_S = 120.0  # a holder on another host is taken over this long after its last renewal

# What a run writes at the top of output.dir (trainer, checkpoint manager, export).
_RUN_FILES = re.compile(r"^(config\.yaml|config-resumed-iter-\d+\.yaml|metrics\.jsonl|checkpoints|export(-iter-\d+)?)$")
# What checkpoints/ holds: checkpoint directories, complete or not, and those set aside as damaged.
_CHECKPOINT_ENTRY = re.compile(r"^iter-\d{6,}(\.damaged(-\d+)?)?$")


@dataclass(frozen=True)
class RunDir:
    """A run's ``output.dir``, resolved once: where each file of the run lives (the names :data:`_RUN_FILES`
    allows), and the folder's check and writer claim."""

    root: Path
    field: str = "output.dir"  # the config field errors name

    @classmethod
    def of(cls, config: RunConfig) -> RunDir:
        return cls(Path(config.output.dir))

    @property
    def config_yaml(self) -> Path:
        return self.root / "config.yaml"

    def resumed_config_yaml(self, iteration: int) -> Path:
        """The config of a run resumed at ``iteration``, kept beside the original (never overwritten)."""
        return self.root / f"config-resumed-iter-{iteration:06d}.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def export(self) -> Path:
        return self.root / "export"

    def export_beside(self, iteration: int) -> Path:
        """Where a longer run resumed after an earlier export writes its own, beside that one."""
        return self.root / f"export-iter-{iteration:06d}"

    def check(self) -> None:
        """:func:`check_run_dir` (every rank, before any work)."""
        check_run_dir(self.root, self.field)

    def claim(self, config_hash: str) -> WriterClaim:
        """:func:`claim_run_dir` (rank 0, before anything is written there)."""
        return claim_run_dir(self.root, config_hash, self.field)


def _is_marked(out: Path, field: str = "output.dir") -> bool:
    """Whether ``out`` has a run marker; a marker that is there but damaged is refused (it is written whole,
    a temp file renamed into place, so no kill leaves it torn: something else changed it)."""
    marker = out / MARKER
    if not os.path.lexists(marker):
        return False
    fix = (
        "g2rpo writes it whole, so something else changed it: if this folder is your g2rpo run, restore the "
        "marker from a copy or remove it (a run with a complete checkpoint is then adopted); otherwise choose "
        "another output.dir"
    )
    try:
        value = read_json_file(marker, what="run marker", fix=fix, max_bytes=RECORD_MAX_BYTES)
    except G2RPOError as exc:
        raise G2RPOError(problem(field, str(out), str(exc))) from None
    if value.get("tool") != "g2rpo":
        raise G2RPOError(
            problem(field, str(out), f"run marker {str(marker)!r} has tool={value.get('tool')!r}, not 'g2rpo': {fix}")
        )
    return True


def foreign_entries(out: str | Path, field: str = "output.dir") -> list[str]:
    """The names in ``out`` that are not a g2rpo run's (empty when the trainer may write there)."""
    out = Path(out)
    if not out.is_dir() or _is_marked(out, field):
        return []
    names = sorted(os.listdir(out))
    checkpoints = out / "checkpoints"
    # the marker or the writer claim, or their temp files mid-write
    owned: set[str] = {n for n in names if n.startswith((MARKER, WRITER))}
    if checkpoints.is_dir():
        entries = list(checkpoints.iterdir())
        if all(_CHECKPOINT_ENTRY.match(e.name) and e.is_dir() for e in entries):
            owned.add("checkpoints")
            if any(is_complete(e) for e in entries):  # a run from before the marker: adopt its files
                owned.update(n for n in names if _RUN_FILES.match(n))
    return [n for n in names if n not in owned]


def check_run_dir(out: str | Path, field: str = "output.dir") -> None:
    """Refuse an ``out`` that cannot be written, or that holds files not of a g2rpo run, naming them and the fix."""
    out = Path(out)
    check_writable(out, field)
    foreign = foreign_entries(out, field)
    if foreign:
        shown = ", ".join(foreign[:8]) + (f" and {len(foreign) - 8} more" if len(foreign) > 8 else "")
        raise G2RPOError(
            problem(
                field,
                str(out),
                f"holds files that are not a g2rpo run's ({shown}) and g2rpo never writes over or beside them: "
                f"choose another output.dir, a new or empty folder (e.g. {out / 'run'})",
            )
        )


def claim_run_dir(
    out: str | Path, config_hash: str, field: str = "output.dir", lease_s: float = WRITER_LEASE_S
) -> WriterClaim:
    """Check ``out`` (:func:`check_run_dir`), create it, take the writer claim and write the marker if it
    has none — before anything else is written there. Rank 0 only; the other ranks call
    :func:`check_run_dir`. Release the returned claim when the run ends."""
    out = Path(out)
    check_run_dir(out, field)
    out.mkdir(parents=True, exist_ok=True)
    claim = _take_writer_claim(out, field, lease_s)
    if not _is_marked(out):
        _write_marker(out, config_hash)
    return claim


def _write_marker(out: Path, config_hash: str) -> None:
    marker = {
        "tool": "g2rpo",
        "version": __version__,
        "config_hash": config_hash,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    temp = out / f"{MARKER}.{os.getpid()}.tmp"
    temp.write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    os.replace(temp, out / MARKER)  # another rank listing the folder sees the whole marker or none


class WriterClaim:
    """This process's claim on a run folder (:data:`WRITER`), renewed by a daemon thread until :meth:`release`."""

    def __init__(self, path: Path, holder: dict) -> None:
        self.path, self.holder = path, holder
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="g2rpo-run-claim", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(float(self.holder["lease_s"]) / 6):
            if _read_holder(self.path).get("token") != self.holder["token"]:
                return  # taken over (we were thought gone): never write over the new holder's claim
            _write_json(self.path, {**self.holder, "renewed_at": _now_iso()})

    def release(self) -> None:
        """Stop renewing and remove the claim (if it is still ours)."""
        self._stop.set()
        self._thread.join(timeout=5)
        if _read_holder(self.path).get("token") == self.holder["token"]:
            self.path.unlink(missing_ok=True)


def _take_writer_claim(out: Path, field: str, lease_s: float) -> WriterClaim:
    path = out / WRITER
    now = _now_iso()
    holder = {
        "tool": "g2rpo",
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "pid_started": process_start(os.getpid()),
        "started": now,
        "renewed_at": now,
        "lease_s": float(lease_s),
        "token": uuid.uuid4().hex,
    }
    body = (json.dumps(holder, indent=1) + "\n").encode()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                kind = os.lstat(path).st_mode
            except FileNotFoundError:  # released meanwhile: try again
                continue
            if not stat.S_ISREG(kind):  # never a claim g2rpo wrote: not to be taken over (or deleted)
                raise G2RPOError(
                    problem(
                        field,
                        str(out),
                        f"its writer claim {str(path)!r} is {describe_kind(kind)}, not a file g2rpo wrote: remove it, "
                        "or choose another output.dir",
                    )
                ) from None
            current = _read_holder(path)
            gone = _holder_gone(current)
            if gone is None:
                raise G2RPOError(_refusal(out, field, current)) from None
            # Set the stale claim aside under a unique name: of two processes taking it over, one moves it.
            aside = path.with_name(f"{WRITER}.stale-{os.getpid()}-{holder['token'][:8]}")
            try:
                os.rename(path, aside)
            except FileNotFoundError:
                continue
            moved = _read_holder(aside)
            if moved.get("token") != current.get("token"):  # moved a newer, live claim: put it back
                try:
                    os.link(aside, path)
                except FileExistsError:
                    pass
                aside.unlink(missing_ok=True)
                continue
            aside.unlink(missing_ok=True)
            if current.get("pid") != os.getpid():
                print(
                    f"g2rpo train: {out}: taking over the writer claim of {_who(current)}: {gone}",
                    file=sys.stderr,
                    flush=True,
                )
            continue
        with os.fdopen(fd, "wb") as handle:
            handle.write(body)
        return WriterClaim(path, holder)
    raise G2RPOError(_refusal(out, field, _read_holder(path)))


def _who(holder: dict) -> str:
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}"


def _refusal(out: Path, field: str, holder: dict) -> str:
    lease = holder.get("lease_s")
    lapse = (
        f"; if that process died on another machine, its claim lapses {float(lease):g} s after its last renewal "
        f"({holder.get('renewed_at', '?')})"
        if isinstance(lease, (int, float))
        else ""
    )
    return problem(
        field,
        str(out),
        f"another g2rpo train is writing there ({_who(holder)}; claim {out / WRITER}): wait for it to end or stop "
        f"it, or choose another output.dir{lapse}",
    )


def _holder_gone(holder: dict) -> str | None:
    """Why a writer claim's holder is gone, or None while it may be alive."""
    if not holder:
        return "the claim is empty or unreadable (a holder killed while writing it)"
    renewed = holder.get("renewed_at")
    lease = holder.get("lease_s")
    if isinstance(renewed, str) and isinstance(lease, (int, float)):
        try:
            age = time.time() - datetime.fromisoformat(renewed).timestamp()
        except ValueError:
            age = 0.0
        if age > lease:
            return f"its lease was last renewed {age:.0f} s ago (lease {lease:g} s)"
    pid = holder.get("pid")
    if holder.get("host") != socket.gethostname() or not isinstance(pid, int) or isinstance(pid, bool):
        return None  # another machine's process: only its lease can tell
    if pid == os.getpid():
        return "it is this process's own earlier claim"
    if not pid_alive(pid):
        return f"process {pid} on this host is gone"
    started = process_start(pid)
    if started is not None and holder.get("pid_started") not in (None, started):
        return f"process {pid} on this host is gone (the pid belongs to a newer process now)"
    return None


def _read_holder(path: Path) -> dict:
    """The claim's holder; {} for a claim that is empty, cut short or damaged (a holder killed between
    creating the claim and writing it), which :func:`_holder_gone` reads as gone."""
    try:
        return read_json_file(path, what="writer claim", fix="", max_bytes=RECORD_MAX_BYTES)
    except G2RPOError:
        return {}


def _write_json(path: Path, value: dict) -> None:
    temp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    temp.write_text(json.dumps(value, indent=1) + "\n", encoding="utf-8")
    os.replace(temp, path)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")
