"""Credit-assignment strategies behind one interface (:mod:`g2rpo.strategies.base`).

One module per strategy, each holding its class and its own settings section:
:mod:`~g2rpo.strategies.g2rpo`, :mod:`~g2rpo.strategies.dancegrpo`, :mod:`~g2rpo.strategies.mixgrpo`,
:mod:`~g2rpo.strategies.flowgrpo`, :mod:`~g2rpo.strategies.diffusionnft`,
:mod:`~g2rpo.strategies.branchgrpo`.
:data:`STRATEGIES` lists them; :func:`build_strategy` picks one by ``AlgorithmConfig.strategy``.
A preset (:data:`PRESETS`) is another name for a strategy with some of its settings fixed.

Adding a strategy: its module (a class meeting :class:`~g2rpo.strategies.base.Strategy` and a
:class:`~g2rpo.strategies.base.StrategySettings` section), a line here, and its section field in
:class:`~g2rpo.strategies.config.AlgorithmConfig` (a test checks the two agree).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from g2rpo.strategies.base import Strategy
from g2rpo.strategies.branchgrpo import BranchGRPO
from g2rpo.strategies.dancegrpo import DanceGRPO
from g2rpo.strategies.diffusionnft import DiffusionNFT
from g2rpo.strategies.flowgrpo import FlowGRPO
from g2rpo.strategies.g2rpo import G2RPO
from g2rpo.strategies.mixgrpo import MixGRPO

if TYPE_CHECKING:  # the config imports this registry to check strategy names
    from g2rpo.strategies.config import AlgorithmConfig

__all__ = ["STRATEGIES", "PRESETS", "build_strategy"]

STRATEGIES: dict[str, type[Strategy]] = {
    "g2rpo": G2RPO,
    "dancegrpo": DanceGRPO,
    "mixgrpo": MixGRPO,
    "flowgrpo": FlowGRPO,
    "diffusionnft": DiffusionNFT,
    "branchgrpo": BranchGRPO,
}

# preset name -> (strategy, the settings of its section it fixes)
PRESETS: dict[str, tuple[str, dict[str, Any]]] = {
    "g2rpo_no_mgai": ("g2rpo", {"granularities": [1]}),  # G²RPO without MGAI: one stride (docs/algorithm.md §9)
}


def build_strategy(config: AlgorithmConfig) -> Strategy:
    """The strategy named by ``config.strategy``, built from ``config``."""
    return STRATEGIES[config.strategy](config)
