"""The chart's alert rules: valid for promtool, and every alert unit-tested firing and not firing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.observability.promservers import RULES

HERE = Path(__file__).resolve().parent
UNIT_TESTS = HERE / "g2rpo-rules.test.yaml"

pytestmark = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")


def _promtool(*args: str, cwd: Path = HERE) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_promtool_checks_the_rules():
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 10 rules found" in result.stdout


def test_every_alert_has_unit_tests_firing_and_not_firing():
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]}
    fires, silent = set(), set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case["alert_rule_test"]:
            (fires if check["exp_alerts"] else silent).add(check["alertname"])
    # "not firing" is also asserted wherever a firing check lists only some of a test's series
    assert fires == alerts
    assert alerts - silent <= {"G2RPOChallengerOutOfDomainRegression", "G2RPOPipelineRunFailed"}


def test_promtool_unit_tests_pass():
    result = _promtool("test", "rules", UNIT_TESTS.name)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_catch_a_broken_threshold(tmp_path):
    """The unit tests can fail: a stall threshold of 2 h instead of 30 min breaks them."""
    rules = tmp_path / "charts" / "g2rpo" / "rules" / "g2rpo-rules.yaml"
    rules.parent.mkdir(parents=True)
    rules.write_text(
        RULES.read_text().replace(
            "g2rpo_training_last_iteration_timestamp_seconds > 1800",
            "g2rpo_training_last_iteration_timestamp_seconds > 7200",
        )
    )
    tests = tmp_path / "tests" / "observability" / UNIT_TESTS.name
    tests.parent.mkdir(parents=True)
    tests.write_text(UNIT_TESTS.read_text())
    result = _promtool("test", "rules", tests.name, cwd=tests.parent)
    assert result.returncode != 0
    assert "G2RPOTrainingStalled" in result.stdout + result.stderr
