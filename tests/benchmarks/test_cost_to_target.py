"""benchmarks.cost_to_target on hand-made runs: the target, first-reach costs, ratios and the paired bootstrap."""

from __future__ import annotations

import math

import pytest

from benchmarks.cost_to_target import cost_to_target, first_reach, main, markdown, mean_curve


def _run(method: str, seed: int, points: list[tuple[float, float]]) -> dict:
    # an eval curve of shapes_colour against flops (and the same numbers as seconds / 10)
    return {
        "method": method,
        "rewards": "learned",
        "seed": seed,
        "evals": [{"flops": x, "quiet_seconds": x / 10, "shapes_colour": y} for x, y in points],
    }


def _result() -> dict:
    # reference "slow" ends at 0.8 (mean of 0.7 and 0.9) at cost 100; "fast" reaches 0.8 halfway between 10 and 20;
    # "never" tops out at 0.6
    runs = [
        _run("slow", 0, [(0, 0.5), (50, 0.6), (100, 0.7)]),
        _run("slow", 1, [(0, 0.5), (50, 0.8), (100, 0.9)]),
        _run("fast", 0, [(0, 0.5), (10, 0.7), (20, 0.9), (40, 0.9)]),
        _run("fast", 1, [(0, 0.5), (10, 0.7), (20, 0.9), (40, 0.9)]),
        _run("never", 0, [(0, 0.5), (100, 0.6)]),
        _run("never", 1, [(0, 0.5), (100, 0.6)]),
    ]
    return {"runs": runs, "summary": {"learned": {}}}


def test_first_reach_interpolates_and_says_never():
    curve = [(0.0, 0.5), (10.0, 0.7), (20.0, 0.9)]
    assert first_reach(curve, 0.8) == pytest.approx(15.0)
    assert first_reach(curve, 0.4) == 0.0
    assert first_reach(curve, 0.95) == math.inf
    # the mean of two seeds' curves at every reading point of either, up to the least end
    runs = [_run("a", 0, [(0, 0.0), (10, 1.0)]), _run("a", 1, [(0, 0.0), (5, 1.0), (20, 1.0)])]
    assert mean_curve(runs, "flops", "shapes_colour") == [(0, 0.0), (5, 0.75), (10, 1.0)]


def test_cost_to_target_reads_the_reference_end_as_the_target(tmp_path):
    table = cost_to_target(_result(), "learned", "slow", ["shapes_colour"], resamples=200)
    entry = table["axes"]["flops"]["shapes_colour"]
    assert entry["target"] == pytest.approx(0.8) and entry["reference_cost"] == 100
    rows = entry["methods"]
    assert rows["fast"]["cost"] == pytest.approx(15.0) and rows["fast"]["ratio"] == pytest.approx(0.15)
    assert rows["slow"]["ratio"] == pytest.approx(1.0)
    assert rows["never"]["cost"] == math.inf and rows["never"]["reached_share"] == 0.0
    # every resample of "fast" (identical seeds) reaches the target; its interval holds the point estimate
    lo, hi = rows["fast"]["ratio_ci95"]
    assert rows["fast"]["reached_share"] == 1.0 and lo <= 0.15 <= hi
    assert table["axes"]["quiet_seconds"]["shapes_colour"]["methods"]["fast"]["cost"] == pytest.approx(1.5)
    assert "never" in markdown(table, "cmd")


def test_main_writes_json_with_never_as_null(tmp_path):
    import json

    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(_result()))
    assert main([str(path), "--reference", "slow", "--metrics", "shapes_colour", "--resamples", "50"]) == 0
    written = json.loads((tmp_path / "cost_to_target.json").read_text())
    assert written["axes"]["flops"]["shapes_colour"]["methods"]["never"]["cost"] is None
    assert (tmp_path / "cost_to_target.md").is_file()


def _long_and_dense():
    # "cheap" is read only at iterations 0, 10 and 20 in the long file; a re-run of its seeds to iteration 10 read
    # every 2 iterations shows it crosses the target at iteration 4, not somewhere on the straight line to 10.
    def run(method, seed, points, per_iteration_flops):
        evals = [{"iteration": i, "flops": i * per_iteration_flops, "shapes_colour": y} for i, y in points]
        last = points[-1][0]
        return {
            "method": method, "rewards": "learned", "seed": seed, "lr": 1e-3, "iterations": last,
            "flops": last * per_iteration_flops, "quiet_seconds": last * 0.5, "evals": evals,
        }  # fmt: skip

    long_runs = [run("dear", s, [(0, 0.5), (10, 0.8)], 10.0) for s in (0, 1)] + [
        run("cheap", s, [(0, 0.5), (10, 0.82), (20, 0.85)], 1.0) for s in (0, 1)
    ]
    for r in long_runs:
        for p in r["evals"]:
            p["quiet_seconds"] = p["iteration"] * 0.5
    dense = [run("cheap", s, [(0, 0.5), (2, 0.7), (4, 0.8), (6, 0.81), (8, 0.815), (10, 0.82)], 1.0) for s in (0, 1)]
    for r in dense:
        r["quiet_seconds"] = r["iterations"] * 3.0  # its own probe, timed under load: must not be used
    return {"runs": long_runs, "summary": {"learned": {}}}, {"runs": dense}


def test_denser_readings_join_a_long_run_they_retrace():
    from benchmarks.cost_to_target import merge_readings

    result, readings = _long_and_dense()
    before = cost_to_target(result, "learned", "dear", ["shapes_colour"], resamples=20)
    lines = merge_readings(result, readings, ["shapes_colour"])
    after = cost_to_target(result, "learned", "dear", ["shapes_colour"], resamples=20)
    assert len(lines) == 2 and "iterations [10] agree" in lines[0]
    # on the long readings alone "cheap" crosses 0.8 at 0.3 / 0.32 of the way to iteration 10 (9.375 FLOPs);
    # with the dense ones, exactly at iteration 4
    assert before["axes"]["flops"]["shapes_colour"]["methods"]["cheap"]["cost"] == pytest.approx(10 * 0.3 / 0.32)
    assert after["axes"]["flops"]["shapes_colour"]["methods"]["cheap"]["cost"] == pytest.approx(4.0)
    # seconds come from the long run's probe (0.5 s an iteration), not the re-run's
    assert after["axes"]["quiet_seconds"]["shapes_colour"]["methods"]["cheap"]["cost"] == pytest.approx(2.0)


def test_readings_that_do_not_retrace_the_long_run_are_refused(tmp_path):
    import json

    from benchmarks.cost_to_target import PrefixError, merge_readings

    result, readings = _long_and_dense()
    readings["runs"][1]["evals"][-1]["shapes_colour"] = 0.83  # seed 1 went elsewhere by iteration 10
    with pytest.raises(PrefixError, match=r"iteration 10: shapes_colour is 0.83 in the re-run and 0.82"):
        merge_readings(result, readings, ["shapes_colour"])

    result, readings = _long_and_dense()
    for r in readings["runs"]:
        r["evals"] = r["evals"][:-1]  # no shared iteration past 0: nothing shows it is a prefix
    with pytest.raises(PrefixError, match="re-run with --iterations set to an iteration the long run read at"):
        merge_readings(result, readings, ["shapes_colour"])

    result, readings = _long_and_dense()
    readings["runs"][0]["evals"][-1]["shapes_colour"] = 0.9
    (tmp_path / "ablation.json").write_text(json.dumps(result))
    (tmp_path / "dense.json").write_text(json.dumps(readings))
    argv = [str(tmp_path / "ablation.json"), "--reference", "dear", "--metrics", "shapes_colour", "--resamples", "10"]
    assert main([*argv, "--readings", str(tmp_path / "dense.json")]) == 2
    assert not (tmp_path / "cost_to_target.md").exists()  # nothing written from a refused merge
