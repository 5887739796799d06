"""benchmarks/stats.py on numbers worked out by hand (issue 27: paired t, Holm, MDE)."""

from __future__ import annotations

import math

import pytest

from benchmarks.stats import holm, minimum_detectable, paired, t_cdf, t_quantile


@pytest.mark.parametrize(
    ("p", "df", "expected"),
    [
        # Student-t table values (any printed table): t_{0.975} for df 3, 4, 7, 30; t_{0.8} for df 7.
        (0.975, 3, 3.182446),
        (0.975, 4, 2.776445),
        (0.975, 7, 2.364624),
        (0.975, 30, 2.042272),
        (0.8, 7, 0.896030),
        (0.975, 1, 12.706205),
    ],
)
def test_t_quantiles_match_the_table(p, df, expected):
    assert t_quantile(p, df) == pytest.approx(expected, abs=2e-6)
    assert t_cdf(expected, df) == pytest.approx(p, abs=1e-6)


def test_t_quantile_past_the_old_table_is_not_the_normal_one():
    # df = 10: 2.228139, not 1.96 (the old fallback for n ≥ 11); df → ∞ tends to 1.959964.
    assert t_quantile(0.975, 10) == pytest.approx(2.228139, abs=2e-6)
    assert t_quantile(0.975, 1e6) == pytest.approx(1.959964, abs=1e-5)
    assert t_quantile(0.025, 10) == pytest.approx(-2.228139, abs=2e-6)


def test_paired_difference_by_hand():
    # d = [2, 3, 2, 3]: mean 2.5; Σ(d − 2.5)² = 4 · 0.25 = 1, sd = √(1/3) = 0.577350;
    # se = sd / 2 = 0.288675; t = 2.5 / 0.288675 = 8.660254; half = 3.182446 · 0.288675 = 0.918693.
    # p: for 3 df the CDF has a closed form, F(t) = ½ + (1/π)·(u/(1 + u²) + atan u) with u = t/√3 = 5:
    # (5/26 + atan 5)/π = (0.1923077 + 1.3734008)/π = 0.4983805, so p = 2 · (0.5 − 0.4983805) = 0.003239.
    out = paired([3, 5, 4, 6], [1, 2, 2, 3])
    assert out["mean"] == pytest.approx(2.5)
    assert out["sd"] == pytest.approx(math.sqrt(1 / 3))
    assert out["t"] == pytest.approx(8.660254, abs=1e-6)
    assert out["half_width"] == pytest.approx(0.918693, abs=1e-6)
    assert out["p"] == pytest.approx(0.003239, abs=1e-6)
    with pytest.raises(ValueError, match="equal-length"):
        paired([1, 2], [1])


def test_holm_by_hand():
    # sorted 0.01, 0.03, 0.04 (m = 3): 3 · 0.01 = 0.03; 2 · 0.03 = 0.06; 1 · 0.04 = 0.04 → max(0.06, 0.04).
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1, monotone


def test_minimum_detectable_by_hand():
    # sd 1, n 8: (t_{0.975,7} + t_{0.8,7}) / √8 = (2.364624 + 0.896030) / 2.828427 = 1.152817.
    assert minimum_detectable(1.0, 8) == pytest.approx(1.152817, abs=1e-5)


def test_paired_table_reads_each_view_at_its_point_and_pairs_by_seed():
    from benchmarks.paired import compare

    def run(method, seed, colour_at_4):  # two eval points: 0 at the start, colour_at_4 at iteration 4
        evals = [
            {"iteration": 0, "compute": 0, "seconds": 0.0, "shapes_colour": 0.5, "shapes_shape": 0.5},
            {"iteration": 4, "compute": 40, "seconds": 8.0, "shapes_colour": colour_at_4, "shapes_shape": 0.5},
        ]
        return {"method": method, "rewards": "multi", "seed": seed, "evals": evals}

    # at iteration 4: a = 0.8, 1.0, 1.2 and b = 0.6; at iteration 2 (halfway, linear) a = 0.65, 0.75, 0.85
    # and b = 0.55, so a − b per seed = [0.1, 0.2, 0.3] (mean 0.2); at the budget (iteration 4) [0.2, 0.4, 0.6].
    runs = [run("a", s, 0.5 + d) for s, d in enumerate([0.3, 0.5, 0.7])] + [
        run("b", s, 0.5 + d) for s, d in enumerate([0.1, 0.1, 0.1])
    ]
    result = {
        "settings": {"iterations": 2},
        "summary": {"multi": {"budget_compute": 40, "wall_seconds": 8.0}},
        "runs": runs,
    }
    table = compare(result)
    colour = next(r for r in table["multi/equal_iterations"]["comparisons"] if r["metric"] == "shapes_colour")
    assert (colour["leader"], colour["other"]) == ("a", "b")
    assert colour["mean"] == pytest.approx(0.2)
    at_budget = next(r for r in table["multi/equal_compute"]["comparisons"] if r["metric"] == "shapes_colour")
    assert at_budget["mean"] == pytest.approx(0.4)
    shape = next(r for r in table["multi/equal_compute"]["comparisons"] if r["metric"] == "shapes_shape")
    assert shape["mean"] == 0 and shape["p"] == 1.0 and not shape["significant"]
