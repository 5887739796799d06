"""A TrainJob node's command exits with the trainer's usage status, the one the chart's runtime fails the job on.

The chart's runtime fails a job at once (a Job ``podFailurePolicy`` ``FailJob`` on exit code 2 of container
``node``, a JobSet rule ``FailJobSet`` on the Job reason ``PodFailurePolicy``: tests/chart/test_chart_render.py)
instead of restarting it when ``g2rpo train`` exits 2 (a usage or configuration error: every restart fails
alike). torchrun exits 1 for any failed worker, so that rule never matched; here the node container's exact
command (:func:`train_command`, as the Trainer runs it) is run with a model path that does not exist.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from g2rpo.errors import USAGE_EXIT_STATUS
from g2rpo.launch.torchrun import exit_status
from g2rpo.launch.trainjob import CONFIG_ENV, CONFIG_PATH, train_command
from tests.trainer.trainer_testlib import REPO, subprocess_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _node_env(config_yaml: str) -> dict[str, str]:
    """One node's environment as the Trainer's torch plugin sets it (one node here), the config in CONFIG_ENV."""
    env = subprocess_env()  # this checkout on PYTHONPATH, one thread
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"  # python, as on the image's PATH
    env.update(
        {
            CONFIG_ENV: config_yaml,
            "PET_NNODES": "1",
            "PET_NODE_RANK": "0",
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(_free_port()),  # not torchrun's 29500: other runs may hold it
        }
    )
    return env


def _run_node(args: list[str], config_yaml: str, tmp_path: Path) -> subprocess.CompletedProcess:
    command = train_command(args, processes_per_node=1)
    assert command[:2] == ["bash", "-c"] and CONFIG_PATH in command[2]
    command[2] = command[2].replace(CONFIG_PATH, str(tmp_path / "run-config.yaml"))  # not a /tmp shared with others
    return subprocess.run(
        command, env=_node_env(config_yaml), cwd=REPO, capture_output=True, text=True, timeout=240, check=False
    )


def test_a_bad_model_path_exits_with_the_usage_status_through_torchrun(tmp_path):
    config = yaml.safe_load((REPO / "configs" / "tiny-cpu.yaml").read_text())
    missing = tmp_path / "no-such-model"
    config["model"].update(path=str(missing), create_tiny=False)
    config["output"] = {"dir": str(tmp_path / "run")}
    done = _run_node([], yaml.safe_dump(config), tmp_path)
    said = done.stdout + done.stderr
    assert done.returncode == USAGE_EXIT_STATUS == 2, said[-4000:]  # torchrun alone exits 1
    assert "error:" in said and str(missing) in said  # the trainer's own message, in the node's log
    assert "the first rank to fail exited with status 2" in said
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_any_other_failure_exits_1_as_torchrun_does(tmp_path):
    # A crash (a traceback: status 1), or a status that only looks alike (3), is worth a restart.
    for status in (1, 3):
        script = tmp_path / f"worker-{status}.py"
        script.write_text(f"import sys\nsys.exit({status})\n")
        done = subprocess.run(
            [sys.executable, "-m", "g2rpo.launch.torchrun", "--nproc-per-node=1", str(script)],
            env=_node_env("{}"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert done.returncode == 1, done.stderr[-3000:]
        assert f"exitcode  : {status}" in done.stderr  # torchrun's own report stays in the log


def _failure(exitcodes: dict[int, int]) -> ChildFailedError:
    now = time.time()
    failures = {}
    for order, (rank, code) in enumerate(exitcodes.items()):
        failure = ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=code, error_file="<N/A>")
        failure.timestamp = int(now) + order  # the order the ranks failed in
        failures[rank] = failure
    return ChildFailedError("g2rpo", failures)


def test_the_first_failure_decides_the_nodes_status():
    assert exit_status(_failure({0: 2, 1: 2})) == USAGE_EXIT_STATUS  # every rank refused the config
    assert exit_status(_failure({3: 2, 0: -15})) == USAGE_EXIT_STATUS  # the others stopped by torchrun after it
    assert exit_status(_failure({1: 1, 0: 2})) == 1  # a crash first: the usage status came after it
    assert exit_status(_failure({0: -9})) == 1  # killed (OOM): a restart may help


def test_sigterm_to_the_node_reaches_the_trainer_as_under_torchrun(tmp_path):
    # A deleted or drained pod gets SIGTERM on its first process, which the command exec's into: torch's
    # launcher must still forward it to the ranks, which write a checkpoint before they exit (preemption).
    ready, stopped = tmp_path / "ready", tmp_path / "stopped"
    script = tmp_path / "worker.py"
    script.write_text(
        "import signal, sys, time\n"
        f"def stop(*_):\n    open({str(stopped)!r}, 'w').write('checkpointed')\n    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, stop)\n"
        f"open({str(ready)!r}, 'w').write('up')\n"
        "time.sleep(120)\n"
    )
    node = subprocess.Popen(
        [sys.executable, "-m", "g2rpo.launch.torchrun", "--nproc-per-node=1", str(script)],
        env=_node_env("{}"),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and node.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert ready.exists(), node.stdout.read() if node.poll() is not None else "the worker did not start"
        node.terminate()  # SIGTERM, as the kubelet sends it
        node.wait(timeout=60)
    finally:
        if node.poll() is None:
            node.kill()
            node.wait()
    assert stopped.read_text() == "checkpointed"  # the rank got SIGTERM and finished its own way
    assert node.returncode != 0  # not a success: the Job fails and the JobSet restarts the group
