"""The evaluate task's report shows the run's validation curve and the iteration the export holds."""

from __future__ import annotations

from g2rpo.steps.candidates import validation_html
from g2rpo.steps.records import TrainRecord

BASE = {
    "export_uri": "file:///x",
    "base_model_uri": "/m",
    "base_model_name": "shapes",
    "licence": "apache-2.0",
    "config_hash": "h",
    "run_config": "run-config.yaml",
    "iterations": 10,
}
CURVE = [
    {"iteration": 0, "objective": 0.5654, "breached": [], "means": {"colour": 0.5162, "jpeg": -5.1906}},
    {"iteration": 4, "objective": 0.5691, "breached": [], "means": {"colour": 0.5186, "jpeg": -5.3136}},
    {"iteration": 10, "objective": 0.5668, "breached": ["jpeg"], "means": {"colour": 0.5190, "jpeg": -5.5254}},
]


def test_the_report_marks_the_exported_iteration_and_the_breaches():
    record = TrainRecord(
        **BASE,
        selected_iteration=4,
        selection_reason="highest validated objective 0.5691 among 1 of 2 validations within the tolerance",
        early_stop="2 validations in a row breached the out-of-domain tolerance (jpeg; iterations [8, 10])",
        validation_curve=CURVE,
    )
    page = validation_html(record)
    assert "The export holds iteration 4 of 10: highest validated objective 0.5691" in page
    assert "Stopped early: 2 validations in a row breached" in page
    assert (
        "<tr style='font-weight:bold'><td>4 (exported)</td><td>0.5691</td><td>0.5186</td><td>-5.3136</td><td>—</td>"
        in page
    )
    assert (
        "<td>0 (baseline)</td>" in page
        and "<td>10</td><td>0.5668</td><td>0.5190</td><td>-5.5254</td><td>jpeg</td>" in page
    )


def test_without_selection_the_report_says_the_last_iteration_is_exported():
    page = validation_html(TrainRecord(**BASE, validation_curve=CURVE))
    assert "The export holds the last iteration (10)." in page and "Stopped early" not in page
