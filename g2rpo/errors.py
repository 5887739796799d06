"""The one user-facing error type.

Anything a user can fix (a bad config value, a missing file, a wrong checkpoint) raises a
:class:`G2RPOError` whose message names the offending field or path, the value found, and the
fix. The CLI prints these without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


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
