"""Placement strings are Kubernetes quantities, checked before any request (issue 43): ``shm_size:
lots``, ``memory_limit: 1600GB`` or ``cpu_limit: "96 cores"`` passed ``pipeline submit`` (5 requests
sent) and would have failed the pod on the cluster after the run was accepted."""

from __future__ import annotations

from decimal import Decimal

import pytest
import yaml

from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.launch.quantity import quantity_problem, quantity_value
from g2rpo.steps.placement import DEFAULT_PROFILE, load_profile
from g2rpo.steps.train_task import trainjob_for
from tests.pipeline.kfp_server import KfpServer


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("96", Decimal(96)),
        ("500m", Decimal("0.5")),  # milli: half a core
        ("1600Gi", Decimal(1600 * 2**30)),
        ("1.5Gi", Decimal(3 * 2**29)),  # 1.5 × 2³⁰
        ("64M", Decimal(64 * 10**6)),
        ("1e3", Decimal(1000)),  # a decimal exponent
        ("1600GB", None),
        ("96 cores", None),
        ("lots", None),
        ("", None),
        ("Gi", None),
    ],
)
def test_quantities_parse_as_kubernetes_reads_them(text, value):
    assert quantity_value(text) == value


def test_a_memory_size_in_milli_units_is_named_as_the_slip_it_is():
    message = quantity_problem("memory_limit", "1600m", "memory")
    assert message is not None and "1.6 bytes" in message and "did you mean 1600Mi" in message


def _profile(tmp_path, **changes):
    profile = yaml.safe_load(DEFAULT_PROFILE.read_text()) | changes
    path = tmp_path / "profile.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def test_a_profile_with_bad_quantities_is_refused_before_any_request(tmp_path, capsys):
    path = _profile(tmp_path, shm_size="lots", memory_limit="1600GB", cpu_limit="96 cores")
    with KfpServer() as server:
        code = main(["pipeline", "submit", "--host", server.url, "--profile", str(path), "iterations=3"])
        assert server.requests == []
    err = capsys.readouterr().err
    assert code == 2, err
    assert "3 configuration problem(s)" in err, err
    assert "shm_size='lots': not a Kubernetes quantity" in err
    assert "memory_limit='1600GB': not a Kubernetes quantity (did you mean 1600Gi, or 1600G" in err
    assert "cpu_limit='96 cores': not a Kubernetes quantity (did you mean '96'?)" in err


def test_the_shipped_profile_passes():
    profile = load_profile()
    assert (profile.cpu_limit, profile.memory_limit, profile.shm_size) == ("96", "1600Gi", "256Gi")


def test_train_pod_sizes_given_by_hand_are_checked(capsys):
    with KfpServer() as server:
        argv = ["pipeline", "submit", "--host", server.url, "train_pod_cpu=96 cores", "train_pod_memory=4GB"]
        assert main(argv) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert "train_pod_cpu='96 cores': not a Kubernetes quantity" in err, err
    assert "train_pod_memory='4GB': not a Kubernetes quantity (did you mean 4Gi" in err


def test_the_train_task_checks_the_shm_size_it_is_given():
    with pytest.raises(G2RPOError, match=r"shm_size='64 gigs': not a Kubernetes quantity"):
        trainjob_for(image="i", run_id="r", task="train", gpus_per_node=8, shm_size="64 gigs")
    assert (
        trainjob_for(image="i", run_id="r", task="train", gpus_per_node=8, shm_size="64Gi").placement.shm_size == "64Gi"
    )
