"""The run's values checked before ``submit``, ``schedule`` or ``run-local`` does anything: the placement
profile's defaults added to the arguments, then every rule of :mod:`g2rpo.steps.check`."""

from __future__ import annotations

from typing import Any

from g2rpo.steps.check import check_run, run_values
from pipelines.placement import PlacementProfile, load_profile

__all__ = ["check_arguments"]


def check_arguments(arguments: dict[str, Any], profile: PlacementProfile | None = None) -> dict[str, Any]:
    """Raise one G2RPOError listing every problem of the run's values; return the values when there is none."""
    profile = profile or load_profile()
    placement = {
        "gpus_per_node": profile.gpus_per_node,
        "node_selector": dict(profile.node_selector),
        "tolerations": list(profile.tolerations),
    }
    return check_run(run_values(arguments, placement))
