"""The switch for fault points: places where a test kills, stops or holds the real process.

The resume and preemption tests need a run that dies at a known point, the way a preempted node
dies; :mod:`g2rpo.training.failpoints` (training) and :func:`g2rpo.evaluation.resume.fail_point`
(evaluation) are those points, picked by one variable, ``G2RPO_FAULT_KILL_AT=iteration:N`` (or
``checkpoint:N``, ``mirror_part:N``, ``sigterm:N``, ``hold:N``, ``eval_chunk:N``).

A point acts only when a second variable arms it, ``G2RPO_ARM_FAULT_POINTS=1``, which only tests
set: a ``G2RPO_FAULT_KILL_AT`` left in a shell, a pod spec or a resumed job's environment is
ignored, with one line on stderr naming it, instead of killing every attempt at the same iteration.
A point that acts names both variables first, so a kill is never silent.
"""

from __future__ import annotations

import os
import sys

__all__ = ["ARM_ENV", "FAULT_ENV", "announce", "armed_fault", "fault_env"]

FAULT_ENV = "G2RPO_FAULT_KILL_AT"
ARM_ENV = "G2RPO_ARM_FAULT_POINTS"

_warned: set[str] = set()


def armed_fault() -> str | None:
    """The fault point ``G2RPO_FAULT_KILL_AT`` names, when ``G2RPO_ARM_FAULT_POINTS=1`` arms it.

    Unset (every normal run), one dictionary lookup. Set but not armed: None, and stderr says once
    per process that the variable is ignored and how to remove it.
    """
    wanted = os.environ.get(FAULT_ENV)
    if wanted is None:
        return None
    if os.environ.get(ARM_ENV) == "1":
        return wanted
    if wanted not in _warned:
        _warned.add(wanted)
        print(
            f"g2rpo: ignoring {FAULT_ENV}={wanted!r}: it picks a test's fault point, which acts only with "
            f"{ARM_ENV}=1 also set; unset {FAULT_ENV} in this environment (a pod spec, a shell profile)",
            file=sys.stderr,
            flush=True,
        )
    return None


def announce(wanted: str, action: str) -> None:
    """One line on stderr before a fault point acts: the variables that chose it and what it does."""
    print(f"g2rpo fault point {FAULT_ENV}={wanted} ({ARM_ENV}=1): {action}", file=sys.stderr, flush=True)


def fault_env(point: str) -> dict[str, str]:
    """The environment that makes a test's process act at ``point`` (e.g. ``iteration:2``)."""
    return {FAULT_ENV: point, ARM_ENV: "1"}
