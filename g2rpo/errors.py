"""The one user-facing error type.

Anything a user can fix (a bad config value, a missing file, a wrong checkpoint) raises a
:class:`G2RPOError` whose message names the offending field or path, the value found, and the
fix. The CLI prints these without a traceback; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class G2RPOError(Exception):
    """An error the user can fix. The message says what was wrong and how to fix it."""


def problem(field: str, value: object, fix: str) -> str:
    """Format one problem the way every g2rpo error does: ``field=value: fix``."""
    shown = repr(value)
    if len(shown) > 120:
        shown = shown[:117] + "..."
    return f"{field}={shown}: {fix}"


class ConfigError(G2RPOError):
    """One or more configuration problems, all reported at once."""

    def __init__(self, problems: list[str], source: str | None = None):
        self.problems = list(problems)
        self.source = source
        where = f" in {source}" if source else ""
        lines = [f"{len(self.problems)} configuration problem(s){where}:"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))
