"""The rollout benchmark runs (at a tiny size) and its two loops are the same computation.

No timing is asserted (speed lives in benchmarks/results): this checks that the reference-structured
loop it times produces the project's final latents from the same draws, and that both loops make
exactly the forwards their formulas say.
"""

from __future__ import annotations

import json

from benchmarks import rollout as bench
from g2rpo.strategies.g2rpo import sampling_forwards


def run(tmp_path, *extra: str) -> dict:
    out = tmp_path / "rollout.json"
    args = ["--cases", "tiny", "--probe-cases", "", "--steps", "5", "--group", "2", "--repeats", "2", "--output"]
    result = bench.main([*args, str(out), *extra])
    assert json.loads(out.read_text(encoding="utf-8")) == result
    return result


def test_reference_loop_equals_the_project_rollout_and_counts_match(tmp_path):
    result = run(tmp_path)
    (case,) = result["cases"]
    steps, strides = [0, 1, 2], [1, 2, 3]  # M = the noisiest half of T = 5
    assert result["settings"]["trained_steps"] == steps
    project = sampling_forwards(5, 2, steps, strides, "reference")
    reference = bench.reference_forwards(5, 2, steps, strides)
    # reference by hand: anchor 5; per branch at k one forward at x[k] plus per stride the points
    # after k+1 of σ[:k+2] + σ[k+2::λ]: k=0 → 1+(4+2+2), k=1 → 1+(3+2+1), k=2 → 1+(2+1+1)
    assert reference == 5 + 2 * (9 + 7 + 5) == 47
    assert case["project"]["sampling_forwards"] == case["expected_forwards"]["project"] == project
    assert case["reference"]["sampling_forwards"] == case["reference"]["model_calls"] == reference
    assert case["project"]["model_calls"] < project  # batched
    assert result["forward_count_ratio"] == reference / project
    # Batched matmuls round differently from batch-1 ones: equal to float32 rounding.
    assert case["final_latents_max_abs_diff"] <= 1e-5 * max(1.0, case["final_latents_max_abs"])
    assert len(case["ratio"]["all"]) == 2 and case["ratio"]["min"] <= case["ratio"]["median"] <= case["ratio"]["max"]
    assert (tmp_path / "rollout.png").stat().st_size > 0 and result["plot"] == "rollout.png"


def test_one_row_per_call_gives_bitwise_the_reference_latents(tmp_path):
    # At micro_batch 1 both loops run the same batch-1 forwards on the same inputs.
    (case,) = run(tmp_path, "--micro-batch", "1")["cases"]
    assert case["final_latents_equal"] and case["final_latents_max_abs_diff"] == 0.0
    assert case["project"]["model_calls"] == case["project"]["sampling_forwards"]


def test_reference_forwards_at_paper_settings():
    # T = 16, G = 12, M = 0..7, Λ = {1, 2, 3}: 2188 against the project's 1892 (same in both modes)
    steps = list(range(8))
    assert bench.reference_forwards(16, 12, steps, [1, 2, 3]) == 2188
    assert sampling_forwards(16, 12, steps, [1, 2, 3]) == sampling_forwards(16, 12, steps, [1, 2, 3], "reference")
    assert sampling_forwards(16, 12, steps, [1, 2, 3]) == 1892
