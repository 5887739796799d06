"""A KFP host that takes the connection and never answers (issue 43): refused when the 5 s
deadline ends, before the pipeline is imported or its parameters checked (it took the seconds of
imports and checks first, then check_host's 5 s)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from g2rpo.cli import main
from g2rpo.commands.reachability import check_reachable
from g2rpo.errors import G2RPOError
from tests.pipeline.kfp_server import KfpServer
from tests.trainer.trainer_testlib import REPO, subprocess_env


@contextmanager
def hung_host() -> Iterator[str]:
    """A port that takes TCP connections (the kernel's backlog) and never answers a byte."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_hung_host_is_refused_within_the_deadline_naming_it():
    with hung_host() as host:
        started = time.monotonic()
        with pytest.raises(G2RPOError) as info:
            check_reachable(host, timeout=0.5)
        took = time.monotonic() - started
    assert 0.4 < took < 2.0, took  # one deadline for the connection and the answer
    message = str(info.value)
    assert f"--host={host!r}" in message and "took the connection but gave no answer" in message, message
    assert "GET /apis/v2beta1/healthz within 0.5 s" in message and "port-forward" in message


def test_a_live_kfp_server_passes():
    with KfpServer() as server:
        check_reachable(server.url)


def test_a_hung_host_is_refused_before_the_pipeline_is_imported_or_checked(monkeypatch, capsys):
    import g2rpo.steps.check

    def checked(*args, **kwargs):
        raise AssertionError("the parameters were checked before the host answered")

    monkeypatch.setattr(g2rpo.steps.check, "check_arguments", checked)
    monkeypatch.delitem(sys.modules, "pipelines.submit", raising=False)  # re-imported only if reached
    with hung_host() as host:
        for verb in (["submit"], ["schedule", "--cron", "0 0 3 * * *"]):
            assert main(["pipeline", *verb, "--host", host, "iterations=3"]) == 2
            assert "took the connection but gave no answer" in capsys.readouterr().err
            assert "pipelines.submit" not in sys.modules, verb


def test_the_command_refuses_a_hung_host_in_about_the_deadline():
    """The whole command, start-up included: the 5 s deadline plus g2rpo's start (was 9.4 s idle, 13-18 s loaded)."""
    with hung_host() as host:
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "g2rpo", "pipeline", "submit", "--host", host, "iterations=3"],
            env=subprocess_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        took = time.monotonic() - started
    assert done.returncode == 2 and "took the connection but gave no answer" in done.stderr, done.stderr
    assert took < 9.0, f"refused after {took:.1f} s"  # main: 9.4 s on an idle machine
