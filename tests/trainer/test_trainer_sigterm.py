"""SIGTERM mid-iteration (issue 30): the run finishes the iteration, checkpoints it, says so and exits
143; run again, it resumes there and ends with the uninterrupted run's weights (same machine, CPU,
fp32, one thread: bit-identical). Once from inside (the ``sigterm:N`` fail point), once from
outside through torchrun, as Kubernetes ends a training pod: SIGTERM to the container's first
process, torchrun, which passes it to its worker's process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from trainer_testlib import REPO, as_cli, export_weights, run_train, subprocess_env, tiny_overrides

from g2rpo.faults import fault_env
from g2rpo.training.checkpoint import is_complete
from g2rpo.training.preemption import exit_status
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

ITERATIONS = 5


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_flux(tmp_path_factory.mktemp("sigterm_tiny_flux"))


def test_sigterm_checkpoints_the_iteration_and_resumes_to_the_same_weights(tiny_model, tmp_path):
    whole = tmp_path / "whole"
    assert run_train(tiny_overrides(tiny_model, whole, **{"train.iterations": ITERATIONS})).returncode == 0
    out = tmp_path / "stopped"
    # checkpoints every 100 iterations: only the stop can have written one. The fail point "sigterm:3"
    # fires inside the step that starts at iteration 3; finishing it makes iteration 4 (iter-000004).
    config = tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS, "train.checkpoint_every": 100})
    stopped = run_train(config, fault="sigterm:3")  # SIGTERM mid-step, before its optimiser step
    assert stopped.returncode == exit_status(signal.SIGTERM) == 143, stopped.stderr[-3000:]
    assert "SIGTERM received: finishing this iteration" in stopped.stderr
    assert "stopped by SIGTERM after iteration 4" in stopped.stderr
    assert is_complete(out / "checkpoints" / "iter-000004")
    assert not (out / "export").exists()
    events = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert {"event": "preempted", "iteration": 4, "signal": "SIGTERM"}.items() <= events[-1].items()
    resumed = run_train(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    wa, wb = export_weights(whole), export_weights(out)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_sigterm_to_torchrun_as_a_deleted_pod_gets_it_checkpoints_and_resumes_to_the_same_weights(tiny_model, tmp_path):
    whole = tmp_path / "whole"
    assert run_train(tiny_overrides(tiny_model, whole, **{"train.iterations": ITERATIONS})).returncode == 0
    out = tmp_path / "pod"
    config = tiny_overrides(tiny_model, out, **{"train.iterations": ITERATIONS, "train.checkpoint_every": 100})
    (tmp_path / "base.yaml").write_text("{}\n")
    env = {**subprocess_env(), **fault_env("hold:2")}  # rank 0 waits in iteration 2 for the signal
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1"]
    command += ["-m", "g2rpo", "train", "--config", str(tmp_path / "base.yaml"), *as_cli(config)]
    agent = subprocess.Popen(command, env=env, cwd=REPO, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    holding = threading.Event()

    def read() -> None:
        for line in agent.stderr:
            lines.append(line)
            if "holding in iteration 2" in line:
                holding.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert holding.wait(240), "".join(lines)[-3000:]
        time.sleep(0.5)
        os.kill(agent.pid, signal.SIGTERM)  # what the kubelet sends the container's first process
        agent.wait(120)
    finally:
        if agent.poll() is None:
            agent.kill()
        reader.join(10)
    log = "".join(lines)
    assert "Received 15 death signal, shutting down workers" in log, log[-3000:]  # torchrun passed it on
    assert "SIGTERM received: finishing this iteration" in log, log[-3000:]
    assert "stopped by SIGTERM after iteration 3" in log, log[-3000:]
    assert "Unable to shutdown process" not in log, log[-3000:]  # the worker left within torchrun's 30 s
    assert agent.returncode != 0  # the pod fails, so the JobSet restarts it
    assert is_complete(out / "checkpoints" / "iter-000003") and not (out / "export").exists()
    resumed = run_train(config)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    wa, wb = export_weights(whole), export_weights(out)
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
