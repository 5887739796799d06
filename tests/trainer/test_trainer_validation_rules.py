"""Validation during training, the pure part: mean and CI, selection and early stop on curves
worked out by hand (the derivation next to each expected value), and the config's errors."""

from __future__ import annotations

import math

import pytest
import yaml

from g2rpo.config import load_config
from g2rpo.errors import ConfigError
from g2rpo.training.run_config import RunConfig, TrainSection
from g2rpo.training.validation import (
    MetricSummary,
    ValidationRecord,
    breached_metrics,
    early_stop_reason,
    objective,
    select_best,
    summarize_metric,
    validation_chunks,
    validation_prompt_indices,
)

WEIGHTS = {"colour": 1.0, "shape": 1.0}  # trained; "background" is out-of-domain (weight 0)
TOLERANCE = {"background": 0.05}


def curve(points: list[tuple[int, float, float, float]]) -> list[ValidationRecord]:
    """Records from (iteration, colour, shape, background) means, built with the module's own rules."""
    baseline = {"colour": points[0][1], "shape": points[0][2], "background": points[0][3]}
    out = []
    for iteration, colour, shape, background in points:
        means = {"colour": colour, "shape": shape, "background": background}
        out.append(
            ValidationRecord(
                iteration=iteration,
                metrics={k: MetricSummary(v, v, v, 1) for k, v in means.items()},
                objective=objective(means, WEIGHTS),
                breached=breached_metrics(means, baseline, TOLERANCE),
                forwards=0,
                seconds=0.0,
            )
        )
    return out


# A reward-hacking run: the trained rewards rise, then flatten, while the held-out background falls.
#   it   colour shape  background  objective = colour + shape   background − 0.98 (tolerance −0.05)
#    0   0.50   0.40   0.98        0.90 (baseline)              0
#   10   0.60   0.45   0.97        1.05                         −0.01  within
#   20   0.66   0.50   0.95        1.16                         −0.03  within
#   30   0.70   0.52   0.92        1.22                         −0.06  BREACH
#   40   0.71   0.52   0.90        1.23                         −0.08  BREACH
HACKING = [
    (0, 0.50, 0.40, 0.98),
    (10, 0.60, 0.45, 0.97),
    (20, 0.66, 0.50, 0.95),
    (30, 0.70, 0.52, 0.92),
    (40, 0.71, 0.52, 0.90),
]


def test_selection_takes_the_best_objective_within_tolerance_not_the_last():
    history = curve(HACKING)
    assert [r.breached for r in history] == [[], [], [], ["background"], ["background"]]
    assert history[2].objective == pytest.approx(1.16)
    chosen = select_best(history)
    # 40 has the highest objective (1.23) but breaches; among 10 and 20 (within), 20 is higher (1.16 > 1.05)
    assert chosen.iteration == 20 and chosen.within_tolerance
    assert "2 of 4 validations" in chosen.reason and "[30, 40]" in chosen.reason
    assert select_best(history[:1]) is None  # the baseline alone is never a candidate


def test_selection_prefers_the_earliest_of_equal_objectives_and_falls_back_to_the_last():
    # it 10 and 20 both 0.6 + 0.4 = 1.0: the earlier (fewer updates) is kept
    tied = curve([(0, 0.5, 0.4, 0.9), (10, 0.6, 0.4, 0.9), (20, 0.6, 0.4, 0.9)])
    assert select_best(tied).iteration == 10
    # every candidate falls below 0.98 − 0.05 = 0.93: the last is exported and the reason says why
    broken = curve([(0, 0.5, 0.4, 0.98), (10, 0.6, 0.4, 0.90), (20, 0.7, 0.4, 0.80)])
    chosen = select_best(broken)
    assert (chosen.iteration, chosen.within_tolerance) == (20, False)
    assert "every validation breached" in chosen.reason and "background" in chosen.reason


def test_early_stop_after_k_breaches_in_a_row():
    history = curve(HACKING)
    # K = 2: breaches at 30 and 40 are two in a row -> stop after 40, not after 30
    assert early_stop_reason(history[:4], stop_after_breaches=2, patience=None) is None
    reason = early_stop_reason(history, stop_after_breaches=2, patience=None)
    assert reason.startswith("2 validations in a row breached") and "[30, 40]" in reason
    # K = 3: only two breaches so far
    assert early_stop_reason(history, stop_after_breaches=3, patience=None) is None
    # a breach, a recovery, a breach: never two in a row
    zigzag = curve([(0, 0.5, 0.4, 0.98), (10, 0.6, 0.4, 0.90), (20, 0.6, 0.4, 0.97), (30, 0.6, 0.4, 0.90)])
    assert early_stop_reason(zigzag, stop_after_breaches=2, patience=None) is None


def test_early_stop_without_improvement_for_p_validations():
    #  it  objective
    #   0  0.90
    #  10  1.00  <- best
    #  20  0.99
    #  30  1.00  (equal, not an improvement: the best stays at 10)
    flat = curve([(0, 0.5, 0.4, 0.98), (10, 0.6, 0.4, 0.98), (20, 0.59, 0.4, 0.98), (30, 0.6, 0.4, 0.98)])
    # P = 2: the best is 2 validations old after 30 -> stop; after 20 it is 1 old -> go on
    assert early_stop_reason(flat[:3], stop_after_breaches=None, patience=2) is None
    reason = early_stop_reason(flat, stop_after_breaches=None, patience=2)
    assert "not improved for 2 validations" in reason and "iteration 10" in reason
    assert early_stop_reason(flat, stop_after_breaches=None, patience=3) is None
    # a run that never beats its untrained weights stops too (the baseline is the first best)
    worse = curve([(0, 0.5, 0.4, 0.98), (10, 0.4, 0.4, 0.98)])
    assert "iteration 0" in early_stop_reason(worse, stop_after_breaches=None, patience=1)


def test_mean_and_ci_by_hand():
    # values 1, 2, 3, 4: mean 2.5, sample std √(5/3) = 1.290994, half width 1.959964 · 1.290994 / 2 = 1.265151
    summary = summarize_metric([1.0, 2.0, 3.0, 4.0])
    assert summary.mean == 2.5 and summary.n == 4
    assert summary.ci_low == pytest.approx(2.5 - 1.959964 * math.sqrt(5 / 3) / 2, abs=1e-12)
    assert summary.ci_high == pytest.approx(2.5 + 1.265151, abs=1e-6)
    single = summarize_metric([0.7])
    assert single.mean == 0.7 and math.isnan(single.ci_low)


def test_non_finite_scores_are_counted_out_and_never_selected():
    # 1, NaN, 3: the finite two give mean 2 with n = 2; nothing finite gives a NaN mean with n = 0
    summary = summarize_metric([1.0, math.nan, 3.0])
    assert (summary.mean, summary.n) == (2.0, 2)
    assert math.isnan(summarize_metric([math.inf]).mean) and summarize_metric([math.nan]).n == 0
    # a held-out metric with no finite score breaches; a NaN objective is never the export
    assert breached_metrics({"background": math.nan}, {"background": 0.9}, TOLERANCE) == ["background"]
    history = curve([(0, 0.5, 0.4, 0.98), (10, 0.6, 0.4, 0.98), (20, math.nan, 0.4, 0.98)])
    assert math.isnan(history[2].objective) and select_best(history).iteration == 10


def test_validation_prompts_are_evenly_spaced_and_chunks_fixed():
    # ⌊i·10/4⌋ for i = 0..3 = 0, 2, 5, 7
    assert validation_prompt_indices(4, 10) == [0, 2, 5, 7]
    assert validation_prompt_indices(8, 3) == [0, 1, 2]  # fewer prompts than asked: each once
    assert validation_chunks(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]


def _config(**validation) -> RunConfig:
    raw = {
        "model": {"path": "m"},
        "data": {"prompts": "p.txt"},
        "rewards": {"models": [{"name": "shapes_colour"}, {"name": "shapes_background", "weight": 0.0}]},
        "train": {"precision": "fp32", "validation": {"enabled": True, **validation}},
    }
    return load_config(RunConfig, overrides=_flatten(raw))


def _flatten(raw: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in raw.items():
        if isinstance(value, dict) and key not in ("validation",):
            out += _flatten(value, f"{prefix}{key}.")
        else:
            out.append(f"{prefix}{key}={yaml.safe_dump(value, default_flow_style=True).strip()}")
    return out


def test_validation_config_defaults_off_and_errors_teach():
    assert TrainSection().validation.enabled is False
    good = _config(every=5, max_regression={"shapes_background": 0.05}, stop_after_breaches=2)
    assert good.train.validation.every == 5
    with pytest.raises(ConfigError) as caught:
        _config(
            metrics=["shapes_background", "nope"],
            max_regression={"shapes_colour": 0.1, "shapes_background": -1},
            max_forwards=10,
            seeds=[0, 0],
        )
    text = str(caught.value)
    assert "train.validation.seeds" in text and "list each seed once" in text
    assert "train.validation.max_regression" in text and "finite drop ≥ 0" in text
    with pytest.raises(ConfigError) as caught:
        _config(metrics=["shapes_background", "nope"], max_regression={"shapes_colour": 0.1}, max_forwards=10)
    text = str(caught.value)
    assert "['nope']" in text and "shapes_colour, shapes_background" in text  # names the valid rewards
    assert "must include the trained rewards ['shapes_colour']" in text
    assert "names trained rewards" in text
    # 8 prompts × 2 seeds × 16 steps = 256 forwards > 10
    assert "train.validation.max_forwards=10" in text and "= 256 forwards" in text
    with pytest.raises(ConfigError, match="stop_after_breaches=2: counts breaches of max_regression, which is empty"):
        _config(stop_after_breaches=2)
