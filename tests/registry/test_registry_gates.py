"""Promotion gates: bootstrap, paired comparison, decisions. Pure: no store involved."""

from __future__ import annotations

import numpy as np
import pytest
from registry_helpers import make_scores

from g2rpo.artifacts.promotion import (
    Gates,
    bootstrap_mean_ci,
    decide,
    default_gates_path,
    format_decision,
    load_gates,
    paired_differences,
)
from g2rpo.artifacts.registry import EvalScores, MetricSummary
from g2rpo.config import load_config
from g2rpo.errors import ConfigError, G2RPOError


def _gates(**metrics) -> Gates:
    return Gates.model_validate({"bootstrap_resamples": 2000, "bootstrap_seed": 0, "metrics": metrics})


HPS_IN = {"direction": "higher", "domain": "in", "min_improvement": 0.01, "floor": 0.2}
CLIP_OUT = {"direction": "higher", "domain": "out", "max_regression": 0.01, "floor": 0.25}


def test_registry_bootstrap_ci_hand_values():
    # Constant values: every resample mean is 0.3, so the CI is [0.3, 0.3].
    assert bootstrap_mean_ci(np.full(5, 0.3), 500, 0, 0.95) == pytest.approx((0.3, 0.3))
    # Values {0, 1}: a resample of 2 has mean 0 (p=1/4), 0.5 (p=1/2) or 1 (p=1/4); the 2.5th
    # percentile of 2000 such means is 0 and the 97.5th is 1.
    assert bootstrap_mean_ci(np.array([0.0, 1.0]), 2000, 0, 0.95) == (0.0, 1.0)
    values = np.random.default_rng(3).normal(size=50)
    assert bootstrap_mean_ci(values, 1000, 7, 0.9) == bootstrap_mean_ci(values, 1000, 7, 0.9)  # seeded
    low, high = bootstrap_mean_ci(values, 1000, 7, 0.9)
    assert low < values.mean() < high


def test_registry_paired_differences_align_items():
    champion = make_scores({"hps": 0.30})
    challenger = make_scores({"hps": 0.30}, noise={"hps": [0.01 * k for k in range(16)]})
    diff = paired_differences(challenger, champion, "hps")
    # Items sort by (prompt_id, seed) = (p0,0), (p0,1), (p1,0)...: the k-th offset 0.01·k in order.
    assert diff == pytest.approx([0.01 * k for k in range(16)])
    with pytest.raises(G2RPOError, match="same prompt set"):
        paired_differences(make_scores({"hps": 0.3}, prompt_set="other"), champion, "hps")
    with pytest.raises(G2RPOError, match="same seeds"):
        paired_differences(make_scores({"hps": 0.3}, seeds=[0, 2]), champion, "hps")


def test_registry_asymmetric_comparison_cannot_pass_swapped():
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    champion = make_scores({"hps": 0.300, "clip": 0.300})
    # Better on the in-domain metric (+0.020 ≥ 0.01), slightly worse out of domain (−0.005 ≥ −0.01).
    challenger = make_scores({"hps": 0.320, "clip": 0.295})
    right = decide(challenger, champion, gates, challenger_version=2, champion_version=1)
    by_metric = {r.metric: r for r in right.results}
    assert right.passed
    assert by_metric["hps"].delta == pytest.approx(0.020) and by_metric["hps"].passed
    assert by_metric["hps"].challenger_mean == pytest.approx(0.320)
    assert by_metric["hps"].champion_mean == pytest.approx(0.300)
    assert by_metric["clip"].delta == pytest.approx(-0.005) and by_metric["clip"].passed
    # Swapped arguments: hps change −0.020 < 0.01 fails, so the decision fails.
    swapped = decide(champion, challenger, gates, challenger_version=1, champion_version=2)
    assert not swapped.passed
    assert {r.metric: r.passed for r in swapped.results} == {"hps": False, "clip": True}
    # Better in domain but regressing beyond the allowance out of domain (−0.05 < −0.01): reward hacking.
    hacked = make_scores({"hps": 0.350, "clip": 0.250})
    decision = decide(hacked, champion, gates)
    assert not decision.passed
    assert {r.metric: r.passed for r in decision.results} == {"hps": True, "clip": False}
    assert "beyond the allowed regression" in next(r.reason for r in decision.results if r.metric == "clip")


def test_registry_lower_is_better_direction():
    gates = _gates(hps=HPS_IN, latency={"direction": "lower", "domain": "out", "max_regression": 0.1})
    champion = make_scores({"hps": 0.30, "latency": 1.0})
    faster = make_scores({"hps": 0.32, "latency": 0.8})  # Δ = −(0.8 − 1.0) = +0.2
    slower = make_scores({"hps": 0.32, "latency": 1.3})  # Δ = −(1.3 − 1.0) = −0.3 < −0.1
    assert decide(faster, champion, gates).passed
    result = decide(slower, champion, gates)
    assert not result.passed
    assert next(r for r in result.results if r.metric == "latency").delta == pytest.approx(-0.3)


def test_registry_ci_requirement_rejects_noisy_gain():
    gate = dict(HPS_IN, min_improvement=0.0, require_ci_excludes_zero=True)
    gates = _gates(hps=gate)
    champion = make_scores({"hps": 0.30})
    # Mean gain +0.01 with ±0.2 alternating noise: the paired CI straddles 0.
    noisy = make_scores({"hps": 0.31}, noise={"hps": [0.2 if k % 2 else -0.2 for k in range(16)]})
    result = decide(noisy, champion, gates).results[0]
    assert result.delta == pytest.approx(0.01)
    assert result.ci_low < 0 < result.ci_high and not result.passed
    assert "includes 0" in result.reason
    # The same mean gain on every item: CI = [0.01, 0.01] excludes 0.
    steady = make_scores({"hps": 0.31})
    assert decide(steady, champion, gates).results[0].passed


def test_registry_first_version_uses_floors():
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    ok = decide(make_scores({"hps": 0.21, "clip": 0.26}), None, gates)
    assert ok.passed and {r.kind for r in ok.results} == {"floor"}
    low = decide(make_scores({"hps": 0.21, "clip": 0.24}), None, gates)
    assert not low.passed
    assert {r.metric: r.passed for r in low.results} == {"hps": True, "clip": False}


def test_registry_gate_on_a_metric_the_eval_lacks_is_a_configuration_error():
    # Not a failed gate: the gates file names a metric this eval never measured.
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    for champion in (None, make_scores({"hps": 0.30, "clip": 0.30})):
        with pytest.raises(G2RPOError) as info:
            decide(make_scores({"hps": 0.5, "pick": 0.1}), champion, gates, challenger_version=4)
        message = str(info.value)
        assert message.startswith("gates.metrics=['clip']: the challenger's eval (v4) has no scores for this metric")
        assert "it has hps, pick" in message


def test_registry_gates_file_validation(tmp_path):
    gates, sha = load_gates(default_gates_path())
    assert gates.metrics["hps_v21"].domain == "in" and len(sha) == 64
    bad = tmp_path / "gates.yaml"
    bad.write_text(
        "metrics:\n"
        "  hps: {direction: higher, domain: in}\n"
        "  clip: {direction: higher, domain: out, max_regression: 0.1, require_ci_excludes_zero: true}\n"
        "  pick: {direction: up, domain: out, max_regression: 0.1}\n"
    )
    with pytest.raises(ConfigError) as err:
        load_config(Gates, bad)
    text = str(err.value)
    assert "3 configuration problem(s)" in text
    assert "min_improvement=None" in text and "require_ci_excludes_zero=True" in text
    assert "metrics.pick.direction='up'" in text


def test_registry_decision_printout():
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    decision = decide(
        make_scores({"hps": 0.35, "clip": 0.25}),
        make_scores({"hps": 0.30, "clip": 0.30}),
        gates,
        model="flux-g2rpo",
        challenger_version=3,
        champion_version=2,
    )
    text = format_decision(decision)
    assert text.splitlines()[0] == "flux-g2rpo v3 vs champion v2: 1 of 2 gate(s) not met"
    assert "+0.0500" in text and "-0.0500" in text and "FAIL" in text
    # each reason once, on its gate's row (no second list of them below the table)
    for result in decision.results:
        assert text.count(result.reason) == 1
        (row,) = [line for line in text.splitlines() if result.reason in line]
        assert result.metric in row and ("pass" if result.passed else "FAIL") in row


def test_a_first_versions_printout_shows_the_base_model_and_the_paired_delta():
    """Floors have no champion: with the baseline the challenger was evaluated against, the table shows that
    baseline's mean and the paired Δ with its interval (it showed dashes), the reasons unchanged."""
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    decision = decide(make_scores({"hps": 0.35, "clip": 0.25}), None, gates, model="m", challenger_version=1)
    paired = {"hps": {"delta": 0.05, "ci_low": 0.04, "ci_high": 0.06, "n": 16}}
    text = format_decision(decision, "base model", {"hps": 0.30, "clip": 0.26}, paired)
    lines = text.splitlines()
    assert lines[0] == "m v1 vs absolute floors (no champion): all 2 gate(s) met"
    assert lines[1].split()[:6] == ["gate", "metric", "challenger", "base", "model", "Δ"]
    (hps,) = [line.split() for line in lines if " hps " in line]
    assert hps[:7] == ["floor", "hps", "0.3500", "0.3000", "+0.0500", "[+0.0400,", "+0.0600]"]
    (clip,) = [line.split() for line in lines if " clip " in line]
    assert clip[:5] == ["floor", "clip", "0.2500", "—", "—"]  # no paired number for it: said, not invented
    assert format_decision(decision).splitlines()[1].split()[3] == "champion"  # without a baseline, as before


@pytest.mark.parametrize(
    ("mutate", "named"),
    [
        (lambda d: d["items"].append(dict(d["items"][0], scores={"hps": 9.0})), "items[16]=('p0', 0)"),
        (lambda d: d["items"][3].update(seed=7), "items[3].seed=7: is not in seeds [0, 1]"),
        (lambda d: d["items"][5]["scores"].update(hps=float("nan")), "items[5].scores.hps=nan"),
        (lambda d: d["items"][5]["scores"].update(hps=float("inf")), "items[5].scores.hps=inf"),
        (lambda d: d.update(items=[]), "items=[]"),
        (lambda d: d.update(seeds=[0, 1, 1]), "seeds=[0, 1, 1]"),
    ],
)
def test_registry_eval_scores_refuse_what_pairing_would_hide(mutate, named):
    # A duplicate (prompt, seed) would be dropped by the pairing dict, a stray seed would pair with
    # nothing, and a NaN would poison means and CIs (and is stored as null, breaking the record).
    data = make_scores({"hps": 0.3}).model_dump()
    mutate(data)
    with pytest.raises(ValueError) as err:
        EvalScores.model_validate(data)
    assert named in str(err.value)


def test_registry_missing_gates_file_names_the_option(tmp_path):
    with pytest.raises(G2RPOError, match=r"gates='.*nope.yaml': no such file"):
        load_gates(tmp_path / "nope.yaml")


def test_registry_champion_without_the_gated_metric_is_a_clear_error():
    # A gate added after the champion was evaluated: say so instead of "different items".
    gates = _gates(hps=HPS_IN, clip=CLIP_OUT)
    with pytest.raises(G2RPOError, match="clip=.*the champion's eval has no scores for this metric"):
        decide(make_scores({"hps": 0.35, "clip": 0.3}), make_scores({"hps": 0.30}), gates)


def test_registry_metric_summary_refuses_non_finite():
    # JSON stores NaN as null, which would make the version record unreadable later.
    with pytest.raises(ValueError, match="finite number"):
        MetricSummary(mean=float("nan"), ci_low=0.0, ci_high=1.0, n=3)
