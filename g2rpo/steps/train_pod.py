"""The train task's own pod: sized for training on one node, for waiting on more.

KFP sizes a pod before it starts, from the pipeline's parameters only (its driver substitutes a
pipeline input into the limit; it computes nothing). So the train pod's GPUs, CPU and memory are three
string parameters of their own, ``train_pod_gpus`` / ``train_pod_cpu`` / ``train_pod_memory``, whose
defaults are the profile's one-node placement. With ``nodes > 1`` the train task only creates and
watches the TrainJob, whose pods hold ``nodes × gpus_per_node`` GPUs: its own pod then needs no GPU and
little else (:data:`WAITING`). :func:`size_train_pod` fills the three from ``nodes`` and
``gpus_per_node`` for ``g2rpo pipeline submit|schedule`` (and the chart's CronJob, which calls submit);
:func:`train_pod_problems` refuses values given by hand that would idle GPUs or starve the training.
A run started from the KFP UI must set them itself (the pipeline's description says so).
"""

from __future__ import annotations

from typing import Any

from g2rpo.errors import G2RPOError
from g2rpo.launch.trainjob import train_pod_problems as pod_problems
from g2rpo.steps.placement import PlacementProfile

__all__ = ["TRAIN_POD_PARAMETERS", "WAITING", "size_train_pod", "train_pod_problems"]

TRAIN_POD_PARAMETERS = ("train_pod_gpus", "train_pod_cpu", "train_pod_memory")
# The waiting pod (nodes > 1): no GPU; enough CPU and memory to import the library and watch the TrainJob.
WAITING = {"train_pod_gpus": "0", "train_pod_cpu": "1", "train_pod_memory": "4Gi"}


def _one_node(gpus_per_node: Any, profile: PlacementProfile) -> dict[str, str]:
    return {
        "train_pod_gpus": str(gpus_per_node),
        "train_pod_cpu": profile.cpu_limit,
        "train_pod_memory": profile.memory_limit,
    }


def size_train_pod(arguments: dict[str, Any], profile: PlacementProfile) -> dict[str, Any]:
    """``arguments`` with the train pod's size filled in where not given (see the module docstring)."""
    nodes = arguments.get("nodes", 1)
    gpus = arguments.get("gpus_per_node", str(profile.gpus_per_node))
    size = WAITING if isinstance(nodes, int) and nodes > 1 else _one_node(gpus, profile)
    default = _one_node(profile.gpus_per_node, profile)  # the pipeline's defaults: sent only where different
    given = {key: value for key, value in size.items() if key not in arguments and value != default[key]}
    filled = {**arguments, **given}
    problems = train_pod_problems(filled, profile)
    if problems:
        raise G2RPOError("bad train pod size:\n  - " + "\n  - ".join(problems))
    return filled


def train_pod_problems(values: dict[str, Any], profile: PlacementProfile) -> list[str]:
    """What is wrong with the train pod's GPUs for the run's ``nodes`` and ``gpus_per_node``
    (:func:`g2rpo.launch.trainjob.train_pod_problems`, which the train task checks again)."""
    return pod_problems(
        values.get("nodes", 1),
        values.get("gpus_per_node", profile.gpus_per_node),
        values.get("train_pod_gpus", profile.gpus_per_node),
    )
