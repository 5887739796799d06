"""benchmarks/frontier.py and paired --pairs on hand-made ablation results (issue 31: reward vs cost)."""

from __future__ import annotations

import json

import pytest

from benchmarks.frontier import frontier, main
from benchmarks.paired import compare


def run(method, seed, utility_at_end, flops_end):
    """Two eval points: u = 0.5 at the start, ``utility_at_end`` at ``flops_end`` (colour = shape = u)."""
    start = {"iteration": 0, "compute": 0, "flops": 0, "quiet_seconds": 0.0, "seconds": 0.0}
    end = {"iteration": 4, "compute": 40, "flops": flops_end, "quiet_seconds": flops_end / 10, "seconds": 1.0}

    def scores(u):
        return {"shapes_colour": u, "shapes_shape": u, "hps_v21": u / 2, "clip": u / 2}

    return {
        "method": method,
        "rewards": "learned",
        "seed": seed,
        "evals": [{**start, **scores(0.5)}, {**end, **scores(utility_at_end)}],
    }


@pytest.fixture
def result():
    # a reaches u = 0.9, 0.92, 0.94 at 100 FLOPs; b reaches 0.6 (each seed) at 200 FLOPs.
    runs = [run("a", s, u, 100) for s, u in enumerate([0.9, 0.92, 0.94])]
    runs += [run("b", s, 0.6, 200) for s in range(3)]
    return {
        "settings": {"iterations": 4},
        "summary": {"learned": {"budget_compute": 40, "wall_seconds": 10.0}},
        "runs": runs,
    }


def test_frontier_reads_every_method_on_its_own_curve_at_fractions_of_the_least_reach(result):
    table = frontier(result, "learned")
    block = table["axes"]["flops"]
    assert block["common_budget"] == 100  # the least any method reached: a's end
    half = block["budgets"][1]
    assert half["at"] == 50
    # at 50 FLOPs, linear: a = 0.5 + (u − 0.5)/2 = 0.70, 0.71, 0.72; b = 0.5 + 0.1/4 = 0.525
    assert half["means"]["a"][0] == pytest.approx(0.71)
    assert half["means"]["b"][0] == pytest.approx(0.525)
    assert half["best"] == "a"
    gap = half["gaps"][0]
    assert gap["other"] == "b" and gap["mean"] == pytest.approx(0.185) and gap["called"]
    # the trained score is the mean of the trained rewards (hps_v21, clip): u / 2 here
    assert block["curves"]["b"]["trained"][-1][1] == pytest.approx(0.3)  # b's curve ends at its own reach, 200


def test_frontier_command_writes_table_json_and_plot(tmp_path, result):
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(result))
    assert main([str(path)]) == 0
    text = (tmp_path / "frontier.md").read_text()
    assert "best **a**" in text
    assert json.loads((tmp_path / "frontier.json").read_text())["seeds"] == [0, 1, 2]
    assert (tmp_path / "frontier.png").stat().st_size > 10_000


def test_speedup_is_the_cost_at_which_one_curve_reaches_the_others_final(result):
    from benchmarks.frontier import speedups

    table = frontier(result, "learned")
    # b ends at 0.6 at 200 FLOPs; a's mean curve (0.5 → 0.92 over 0..100, linear) reaches 0.6 at 100·0.1/0.42
    (row,) = [r for r in speedups(table, [("a", "b")]) if r["axis"] == "flops"]
    assert row["level"] == pytest.approx(0.6)
    assert row["fast_cost"] == pytest.approx(100 * 0.1 / 0.42, rel=1e-3)
    assert row["ratio"] == pytest.approx(200 / (100 * 0.1 / 0.42), rel=1e-3)
    (never,) = [r for r in speedups(table, [("b", "a")]) if r["axis"] == "flops"]
    assert never["fast_cost"] is None and never["ratio"] is None


def test_paired_pairs_restricts_the_family_holm_corrects_over(result):
    result["runs"] += [run("c", s, 0.55, 300) for s in range(3)]
    every = compare(result)["learned/equal_compute"]["comparisons"]
    chosen = compare(result, [("a", "b")])["learned/equal_compute"]["comparisons"]
    metrics = 4  # hps_v21, clip and the two exact in-domain rewards
    assert len(every) == 3 * metrics and len(chosen) == metrics
    assert {(r["leader"], r["other"]) for r in chosen} == {("a", "b")}
    # with fewer comparisons Holm multiplies less: the same raw p, a smaller adjusted one

    def a_b(rows):
        return next(r for r in rows if {r["leader"], r["other"]} == {"a", "b"} and r["metric"] == "clip")

    assert a_b(chosen)["p"] == pytest.approx(a_b(every)["p"])
    assert a_b(chosen)["p_holm"] < a_b(every)["p_holm"]
