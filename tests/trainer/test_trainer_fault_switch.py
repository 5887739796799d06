"""Fault points act only when armed (issue 43): a ``G2RPO_FAULT_KILL_AT`` left in a production
environment is ignored and named (it killed every attempt of a resumed job at the same iteration,
without a word), and a point that acts names the variables first."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from trainer_testlib import REPO, run_train, subprocess_env, tiny_overrides

from g2rpo.faults import ARM_ENV, FAULT_ENV, fault_env
from g2rpo.training.failpoints import fail_point
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

_TRAINING_POINT = "from g2rpo.training.failpoints import fail_point; fail_point('iteration', 2); print('went on')"
_EVAL_POINT = "from g2rpo.evaluation.resume import fail_point; fail_point(1); print('went on')"


def _run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = subprocess_env()
    base.pop(FAULT_ENV, None)
    base.pop(ARM_ENV, None)
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize(("code", "point"), [(_TRAINING_POINT, "iteration:2"), (_EVAL_POINT, "eval_chunk:1")])
def test_a_stray_fault_variable_is_ignored_and_named(code, point):
    done = _run(code, {FAULT_ENV: point})  # no arming switch: a variable left in a pod spec
    assert done.returncode == 0 and done.stdout == "went on\n", (done.returncode, done.stderr)
    assert f"ignoring {FAULT_ENV}='{point}'" in done.stderr and f"{ARM_ENV}=1" in done.stderr, done.stderr


@pytest.mark.parametrize(("code", "point"), [(_TRAINING_POINT, "iteration:2"), (_EVAL_POINT, "eval_chunk:1")])
def test_an_armed_fault_point_names_the_variable_before_it_kills(code, point):
    done = _run(code, fault_env(point))
    assert done.returncode == -9 and done.stdout == "", (done.returncode, done.stderr)
    assert f"g2rpo fault point {FAULT_ENV}={point} ({ARM_ENV}=1): SIGKILL" in done.stderr, done.stderr


def test_hold_acts_only_when_armed_and_names_the_variable(monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "hold:3")
    monkeypatch.delenv(ARM_ENV, raising=False)
    monkeypatch.setenv("RANK", "0")
    fail_point("iteration", 3, signalled=lambda: pytest.fail("a stray hold:3 held the run"))
    assert f"ignoring {FAULT_ENV}='hold:3'" in capsys.readouterr().err
    monkeypatch.setenv(ARM_ENV, "1")
    fail_point("iteration", 3, signalled=lambda: True)  # armed: holds, and the signal is already there
    assert f"{FAULT_ENV}=hold:3 ({ARM_ENV}=1): holding in iteration 3" in capsys.readouterr().err


def test_a_training_run_with_a_stray_fault_variable_finishes(tmp_path):
    model = make_tiny_flux(tmp_path / "tiny")
    out = tmp_path / "run"
    # The variable alone, as a pod spec or shell profile would leave it: the switch is not set.
    done = run_train(tiny_overrides(model, out, **{"train.iterations": 2}), env={FAULT_ENV: "iteration:2"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"ignoring {FAULT_ENV}='iteration:2'" in done.stderr
    assert (Path(out) / "export" / "manifest.json").exists()
