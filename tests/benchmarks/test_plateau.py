"""benchmarks/plateau.py on hand-worked numbers (issue 27 §3: has the best method's curve flattened?)."""

from __future__ import annotations

import json

import pytest

from benchmarks.plateau import last_quarter, main, plateau


def test_last_quarter_on_hand_worked_values():
    # per-seed values at ¾ and at the budget; changes 0.01, 0.03, 0.02: mean 0.02, sd 0.01,
    # half-width t(0.975, 2) · 0.01/√3 = 4.302653 · 0.0057735 = 0.024841
    # final values 0.81, 0.83, 0.82: mean 0.82, sd 0.01, the same half-width 0.024841 > 0.02: flattened
    row = last_quarter([0.80, 0.80, 0.80], [0.81, 0.83, 0.82])
    assert row["change"] == pytest.approx(0.02)
    assert row["change_half_width"] == pytest.approx(0.024841, abs=1e-6)
    assert row["final"] == pytest.approx(0.82) and row["final_half_width"] == pytest.approx(0.024841, abs=1e-6)
    assert row["flattened"]
    assert not row["still_rising"]  # 0.02 − 0.024841 < 0: the change's interval holds zero
    # the same seeds' spread, but the last quarter gained 0.05: still rising
    rising = last_quarter([0.76, 0.78, 0.77], [0.81, 0.83, 0.82])
    assert rising["change"] == pytest.approx(0.05) and not rising["flattened"]
    assert rising["still_rising"]  # changes 0.05, 0.05, 0.05: sd 0, interval [0.05, 0.05] above zero
    # flat by the loose test, yet every seed climbed: changes 0.03, 0.04, 0.05 (mean 0.04, sd 0.01, half-width
    # 0.024841 → interval [0.0152, 0.0648] above zero); finals 0.70, 0.80, 0.90 (sd 0.1, half-width 0.24841)
    climbing = last_quarter([0.67, 0.76, 0.85], [0.70, 0.80, 0.90])
    assert climbing["flattened"] and climbing["still_rising"]


def curve(seed, end):
    """colour (and every other metric) rises linearly from 0.5 at 0 compute to ``end`` at 100."""
    points = []
    for c in (0, 50, 100):
        v = 0.5 + (end - 0.5) * c / 100
        points.append({"compute": c, "shapes_colour": v, "shapes_shape": v, "hps_v21": v, "clip": v})
    return {"method": "m", "rewards": "learned", "seed": seed, "evals": points}


def test_plateau_reads_four_budgets_on_each_seeds_curve(tmp_path):
    result = {"summary": {"learned": {"budget_compute": 100}}, "runs": [curve(0, 0.9), curve(1, 0.7)]}
    table = plateau(result)["learned"]
    assert table["points"] == [25, 50, 75, 100]
    row = table["methods"]["m"]["metrics"]["shapes_colour"]
    # seed 0 at ¼: 0.6, seed 1: 0.55 → mean 0.575; at the budget 0.9 and 0.7 → 0.8
    assert row["readings"][0]["mean"] == pytest.approx(0.575) and row["final"] == pytest.approx(0.8)
    # last quarter: +0.1 and +0.05 → +0.075; final half-width t(0.975, 1) · 0.1414/√2 = 12.706 · 0.1 = 1.2706
    assert row["change"] == pytest.approx(0.075) and row["final_half_width"] == pytest.approx(1.2706, abs=1e-3)
    assert row["flattened"]  # two seeds this far apart cannot show a trend: the check says so honestly
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(result))
    assert main([str(path)]) == 0
    text = (tmp_path / "plateau.md").read_text()
    assert "| m | shapes_colour | 0.575 |" in text and "| still rising |" in text
