"""What a ``--overwrite`` may replace: only a folder that is recognisably g2rpo's own kind of artifact.

A writer that replaces an existing folder first asks :func:`check_replaceable`: the folder must hold
nothing but the entries its kind writes (``own``: names or glob patterns of top-level entries), and,
where the kind leaves a marker, that marker. Anything else — a user's ``thesis.tex``, a ``data/``
folder, another tool's output — is refused with the entries found named, so no flag deletes what
the project did not write.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from pathlib import Path

from g2rpo.errors import G2RPOError, problem

__all__ = ["foreign_entries", "check_replaceable"]


def foreign_entries(folder: Path, own: Iterable[str]) -> list[str]:
    """The top-level entries of ``folder`` that match none of the ``own`` names/patterns (sorted)."""
    patterns = list(own)
    return sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in folder.iterdir()
        if not any(fnmatch.fnmatchcase(p.name, pat) for pat in patterns)
    )


def check_replaceable(
    folder: str | Path,
    *,
    field: str,
    kind: str,
    own: Iterable[str],
    is_ours: Callable[[Path], str | None] | None = None,
) -> None:
    """Refuse to replace ``folder`` unless it is empty, or holds only ``own`` entries and ``is_ours``
    (when given) recognises it (it returns None for ours, else why not). The error names what was found."""
    folder = Path(folder)
    if not folder.exists():
        return
    if not folder.is_dir():
        raise G2RPOError(problem(field, str(folder), f"is a file, not a {kind} folder; choose another path"))
    if not any(folder.iterdir()):
        return
    fix = f"--overwrite replaces only a {kind} g2rpo wrote; choose another directory, or move those away yourself"
    foreign = foreign_entries(folder, own)
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise G2RPOError(problem(field, str(folder), f"holds {shown}, which a {kind} does not; {fix}"))
    if is_ours is not None:
        why = is_ours(folder)
        if why is not None:
            raise G2RPOError(problem(field, str(folder), f"is not recognisably a {kind} ({why}); {fix}"))
