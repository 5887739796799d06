"""Credit-assignment strategies behind one interface (:mod:`g2rpo.strategies.base`).

One module per strategy: :mod:`~g2rpo.strategies.g2rpo` (G²RPO, and "without MGAI" as Λ = {1}),
:mod:`~g2rpo.strategies.dancegrpo`, :mod:`~g2rpo.strategies.mixgrpo`. :func:`build_strategy` picks
one by ``AlgorithmConfig.strategy``; the modules are imported only when chosen.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from g2rpo.strategies.base import Strategy
    from g2rpo.strategies.config import AlgorithmConfig

__all__ = ["STRATEGIES", "build_strategy"]

# strategy name -> "module:class"
STRATEGIES: dict[str, str] = {
    "g2rpo": "g2rpo.strategies.g2rpo:G2RPO",
    "g2rpo_no_mgai": "g2rpo.strategies.g2rpo:G2RPO",
    "dancegrpo": "g2rpo.strategies.dancegrpo:DanceGRPO",
    "mixgrpo": "g2rpo.strategies.mixgrpo:MixGRPO",
}


def build_strategy(config: AlgorithmConfig) -> Strategy:
    """The strategy named by ``config.strategy``, built from ``config``."""
    module_name, _, class_name = STRATEGIES[config.strategy].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    return cls(config)
