"""The strategy classes by name, and :func:`build_strategy`, which picks one for a run.

The names are those of :data:`g2rpo.strategies.settings.SETTINGS` (the sections the config reads,
without torch); a test checks the two registries agree.
"""

from __future__ import annotations

from g2rpo.strategies.base import Strategy
from g2rpo.strategies.branchgrpo import BranchGRPO
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.dancegrpo import DanceGRPO
from g2rpo.strategies.diffusionnft import DiffusionNFT
from g2rpo.strategies.flowgrpo import FlowGRPO
from g2rpo.strategies.g2rpo import G2RPO
from g2rpo.strategies.mixgrpo import MixGRPO

__all__ = ["STRATEGIES", "build_strategy"]

STRATEGIES: dict[str, type[Strategy]] = {
    "g2rpo": G2RPO,
    "dancegrpo": DanceGRPO,
    "mixgrpo": MixGRPO,
    "flowgrpo": FlowGRPO,
    "diffusionnft": DiffusionNFT,
    "branchgrpo": BranchGRPO,
}


def build_strategy(config: AlgorithmConfig) -> Strategy:
    """The strategy named by ``config.strategy``, built from ``config``."""
    return STRATEGIES[config.strategy](config)
