"""The one user-facing error type.

Anything a user can fix (a bad config value, a missing file, a wrong checkpoint) raises a
:class:`G2RPOError` whose message names the offending field or path, the value found, and the
fix. The CLI prints these without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
import errno
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

# The exit status of `g2rpo` for a G2RPOError or bad usage: a problem the user must fix, which running the same
# command again does not. A TrainJob's pods fail their Job at once on it instead of using the JobSet's restarts
# (the Helm chart's runtime, g2rpo.launch.torchrun).
USAGE_EXIT_STATUS = 2


class G2RPOError(Exception):
    """An error the user can fix. The message says what was wrong and how to fix it."""


def problem(field: str, value: object, fix: str) -> str:
    """Format one problem the way every g2rpo error does: ``field=value: fix``."""
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return f"{field}={shown}: {fix}"


def closest(word: str, choices: Iterable[str], cutoff: float = 0.6) -> str | None:
    """The valid choice ``word`` most likely misspells (``difflib``'s ratio ≥ ``cutoff``), else None."""
    matches = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=cutoff)
    return matches[0] if matches else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``" (did you mean X?)"`` for the closest valid choice, ``""`` when none is close: what every
    "unknown name" error puts after the name."""
    match = closest(word, choices)
    return f" (did you mean {match}?)" if match else ""


class ConfigError(G2RPOError):
    """One or more configuration problems, all reported at once."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{len(self.problems)} configuration problem(s){where}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


_WRITE_CAUSES = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EROFS: "the filesystem is read-only",
}


def write_failure(what: str, path: str | os.PathLike[str], exc: BaseException) -> G2RPOError:
    """A failed write of ``what`` at ``path`` as an error that names the path and the cause.

    torch's writer reports a full disk as ``RuntimeError: [enforce fail at inline_container.cc] …
    unexpected pos``, without errno; the free space of the filesystem then tells the cause.
    """
    where = Path(path)
    probe = where
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = None
    code = getattr(exc, "errno", None)
    cause = _WRITE_CAUSES.get(code) if code is not None else None
    if cause is None and free is not None and free < 64 * 2**20:
        cause = "the filesystem is (nearly) full"
    space = f"; {free / 2**20:.1f} MiB free on {probe}" if free is not None else ""
    detail = str(exc).splitlines()[0][:200] if str(exc) else exc.__class__.__name__
    return G2RPOError(
        f"writing {what} at {where} failed: {cause or detail}{space}. Free space or fix the permissions (or write "
        "elsewhere), then run the same command again: nothing complete was lost"
        + ("" if cause is None else f" ({detail})")
    )
