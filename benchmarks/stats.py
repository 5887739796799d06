"""Statistics that rank methods: paired differences over seeds, Holm's correction, detectable gaps.

A seed gives every method the same prompt order and the same noise, so two methods are compared by
the per-seed differences d_s = a_s − b_s (s = 1..n), not by two unpaired intervals:

    mean d̄ = (1/n) Σ d_s,   sd = sqrt(Σ (d_s − d̄)² / (n − 1)),   se = sd / √n
    t = d̄ / se (df = n − 1),  two-sided p = 2 · (1 − F_t(|t|; n − 1)),
    95 % interval d̄ ± t_{0.975, n−1} · se.

Holm's step-down correction over the m comparisons a table makes: sort the p-values p_(1) ≤ … ≤
p_(m); the adjusted p_(i) = max_{j ≤ i} min(1, (m − j + 1) · p_(j)). A comparison is significant at
5 % family-wise when its adjusted p < 0.05.

Minimum detectable difference at power 1 − β (two-sided level α), for a paired design with the
observed sd: MDE = (t_{1−α/2, n−1} + t_{1−β, n−1}) · sd / √n (the usual central-t approximation).
"Powered" means the gaps a conclusion rests on exceed it.

The Student-t quantiles are computed here (no SciPy in the environment): the CDF through the
regularised incomplete beta function I_x(a, b) (continued fraction, modified Lentz), inverted by
bisection — exact to ~1e-10, for any df (the old table fell back to 1.96 past df = 9).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["holm", "minimum_detectable", "paired", "t_cdf", "t_quantile"]


def _incomplete_beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b) (valid for x < (a + 1) / (a + b + 2)), modified Lentz."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def _regularised_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b) for 0 ≤ x ≤ 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _incomplete_beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _incomplete_beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) for Student's t with ``df`` degrees of freedom: 1 − ½ I_{df/(df+t²)}(df/2, ½) for t ≥ 0."""
    if df <= 0:
        raise ValueError(f"df={df}: degrees of freedom must be positive")
    tail = 0.5 * _regularised_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on :func:`t_cdf`)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p={p}: a quantile needs 0 < p < 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12:
            break
    return 0.5 * (lo + hi)


def paired(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> dict[str, float]:
    """The per-seed differences a − b: mean, sd, n, interval half-width at ``level``, t and two-sided p."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"paired: need two equal-length samples of at least 2 (got {len(a)} and {len(b)})")
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    mean, sd = statistics.fmean(diffs), statistics.stdev(diffs)
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    if se == 0.0:
        t, p = (math.inf if mean else 0.0), (0.0 if mean else 1.0)
    else:
        t = mean / se
        p = 2.0 * (1.0 - t_cdf(abs(t), n - 1))
    return {"mean": mean, "sd": sd, "n": n, "half_width": half, "t": t, "p": p}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input's order."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def minimum_detectable(sd: float, n: int, alpha: float = 0.05, power: float = 0.8) -> float:
    """The paired difference detectable with probability ``power`` at two-sided level ``alpha``."""
    if n < 2:
        raise ValueError(f"n={n}: need at least 2 paired seeds")
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) * sd / math.sqrt(n)
