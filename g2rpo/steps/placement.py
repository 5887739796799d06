"""The placement profile: where the pipeline's tasks run on a cluster, as validated data.

One YAML file per cluster (``g2rpo/steps/profiles/h200.yaml`` is the default) holds every placement
setting; :func:`load_profile` validates it (unknown keys refused, every problem reported at once).
Only names of Kubernetes objects appear in it, never a secret's value.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator

from g2rpo.config import COUNT_MAX, PROBLEM_SEPARATOR, Section, load_config
from g2rpo.launch.quantity import quantity_problem
from g2rpo.launch.trainjob import MAX_GPUS_PER_NODE

__all__ = ["DEFAULT_PROFILE", "PlacementProfile", "Timeouts", "load_profile"]

DEFAULT_PROFILE = Path(__file__).resolve().parent / "profiles" / "h200.yaml"


class Timeouts(Section):
    """Per-task time limits in seconds (the pod's activeDeadlineSeconds)."""

    prepare: int = Field(ge=60, le=COUNT_MAX)
    train: int = Field(ge=60, le=COUNT_MAX)
    evaluate: int = Field(ge=60, le=COUNT_MAX)
    decide: int = Field(ge=60, le=COUNT_MAX)
    promote: int = Field(ge=60, le=COUNT_MAX)
    report: int = Field(ge=60, le=COUNT_MAX)


class PlacementProfile(Section):
    """A cluster's placement of the alignment pipeline."""

    accelerator_type: str = Field(description="the GPU resource name, e.g. nvidia.com/gpu")
    gpus_per_node: int = Field(ge=1, le=MAX_GPUS_PER_NODE, description="GPUs of the train task's pod (one node)")
    cpu_limit: str = Field(description="CPU limit of the train task, e.g. '96'")
    memory_limit: str = Field(description="memory limit of the train task, e.g. 1600Gi")
    shm_size: str = Field(description="size of the memory emptyDir mounted at /dev/shm on the train task")
    node_selector: dict[str, str] = Field(description="default node selector of the GPU tasks")
    tolerations: list[dict[str, str]] = Field(description="default tolerations of the GPU tasks")
    evaluate_gpus: int = Field(ge=0, le=16, description="GPUs of the evaluate task")
    s3_secret_name: str = Field(min_length=1, description="name of the Secret holding the S3 credentials")
    s3_secret_keys: dict[str, str] = Field(min_length=1, description="secret data key -> environment variable")
    service_account: str = Field(description="Kubernetes service account of the runs")
    pod_labels: dict[str, str] = Field(description="labels of the train pod (Prometheus scraping)")
    timeouts: Timeouts

    @model_validator(mode="after")
    def _quantities(self) -> PlacementProfile:
        # Kubernetes refuses a malformed quantity only when it creates the pod, after the run was accepted.
        problems = [
            quantity_problem("cpu_limit", self.cpu_limit, "cpu"),
            quantity_problem("memory_limit", self.memory_limit, "memory"),
            quantity_problem("shm_size", self.shm_size, "memory"),
        ]
        if any(problems):
            raise ValueError(PROBLEM_SEPARATOR.join(p for p in problems if p))
        return self


def load_profile(path: str | Path | None = None) -> PlacementProfile:
    """The placement profile at ``path`` (default :data:`DEFAULT_PROFILE`), validated."""
    return load_config(PlacementProfile, Path(path) if path is not None else DEFAULT_PROFILE)
