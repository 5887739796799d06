"""benchmarks.stride_agreement's figures on hand-made rewards [R, P, K, J, G]."""

from __future__ import annotations

import math

import pytest
import torch

from benchmarks.stride_agreement import agreement


def test_a_stride_that_shifts_every_branch_alike_agrees_fully():
    # stride 2 = stride 1 + 5 for every branch: the same advantages; jitter std([0, 5]) / std([0, 1, 2]) = 3.536
    s1 = torch.tensor([0.0, 1.0, 2.0])
    rewards = torch.stack([s1, s1 + 5])[None, None, None]  # [1, 1, 1, 2, 3]
    out = agreement(rewards, [1, 2], ["r"])
    for stride in ("stride 1", "stride 2"):
        assert out["all rewards"][stride]["correlation"]["median"] == pytest.approx(1.0)
        assert out["all rewards"][stride]["sign_agreement"]["median"] == pytest.approx(1.0)
    assert out["stride_jitter"]["r"]["median"] == pytest.approx(5 / math.sqrt(2), abs=1e-4)
    assert out["residual_stride_jitter"]["r"]["median"] == pytest.approx(0.0, abs=1e-6)


def test_strides_that_rank_branches_differently_disagree_by_the_hand_worked_amount():
    # A1 = [−1, 0, 1], A2 = [−1, 1, 0] (std 1 each), Σ = [−2, 1, 1]:
    # corr(A1, Σ) = 3 / (√2 · √6) = 0.866; signs (−, 0, +) vs (−, +, +) agree on 2 of 3
    rewards = torch.tensor([[0.0, 1.0, 2.0], [0.0, 2.0, 1.0]])[None, None, None]
    out = agreement(rewards, [1, 3], ["r"])["all rewards"]
    assert out["stride 1"]["correlation"]["median"] == pytest.approx(3 / math.sqrt(12), abs=1e-4)
    assert out["stride 1"]["sign_agreement"]["median"] == pytest.approx(2 / 3, abs=1e-4)
    assert out["stride 3"]["groups"] == 1
    # without the overlap: corr(A1, A2) = (1 + 0 + 0) / (√2 · √2) = 0.5; with two strides leave-one-out is the
    # same figure (Σ − A1 = A2)
    assert out["pairwise"]["1-3"]["median"] == pytest.approx(0.5, abs=1e-4)
    assert out["stride 1"]["leave_one_out"]["median"] == pytest.approx(0.5, abs=1e-4)


def test_leave_one_out_takes_the_stride_out_of_the_sum():
    # three strides: A1 = [−1, 0, 1], A2 = A3 = [1, 0, −1]: pairwise 1-2 and 1-3 are −1, 2-3 is +1;
    # leave-one-out for stride 1 is corr(A1, A2 + A3) = −1
    a1 = torch.tensor([0.0, 1.0, 2.0])
    rewards = torch.stack([a1, 2 - a1, 2 - a1])[None, None, None]  # [1, 1, 1, 3, 3]
    out = agreement(rewards, [1, 2, 3], ["r"])["all rewards"]
    assert out["pairwise"]["1-2"]["median"] == pytest.approx(-1.0)
    assert out["pairwise"]["2-3"]["median"] == pytest.approx(1.0)
    assert out["stride 1"]["leave_one_out"]["median"] == pytest.approx(-1.0)
    assert out["stride 2"]["leave_one_out"] is None  # A1 + A3 = 0: the rest is constant, no ranking to compare


def test_a_constant_group_has_no_ranking_to_agree_with():
    rewards = torch.ones(1, 1, 1, 2, 4)
    out = agreement(rewards, [1, 2], ["r"])
    assert out["all rewards"]["stride 1"]["groups"] == 0
    assert out["all rewards"]["stride 1"]["correlation"] is None
