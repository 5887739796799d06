"""Credit-assignment strategies behind one interface (:mod:`g2rpo.strategies.base`).

One module per strategy, each holding its class: :mod:`~g2rpo.strategies.g2rpo`,
:mod:`~g2rpo.strategies.dancegrpo`, :mod:`~g2rpo.strategies.mixgrpo`, :mod:`~g2rpo.strategies.flowgrpo`,
:mod:`~g2rpo.strategies.diffusionnft`, :mod:`~g2rpo.strategies.branchgrpo`. Their settings sections
are configuration and import no torch: :mod:`~g2rpo.strategies.settings` (one section per strategy,
:data:`~g2rpo.strategies.settings.SETTINGS`, :data:`~g2rpo.strategies.settings.PRESETS`) and
:mod:`~g2rpo.strategies.config` (the ``algorithm`` section that holds them).
:data:`~g2rpo.strategies.registry.STRATEGIES` lists the classes and
:func:`~g2rpo.strategies.registry.build_strategy` picks one by ``AlgorithmConfig.strategy``.

This package's own module imports nothing, so loading the config does not load the strategies
(and torch) through it.

Adding a strategy: its module (a class meeting :class:`~g2rpo.strategies.base.Strategy`), its
:class:`~g2rpo.strategies.settings.StrategySettings` section and entry in ``SETTINGS``, a line in
``STRATEGIES``, and its section field in :class:`~g2rpo.strategies.config.AlgorithmConfig` (a test
checks the four agree).
"""
