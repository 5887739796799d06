"""Reward heads behind one interface: ``score(images [B, 3, H, W] in [0, 1], prompts) -> tensor[B]``.

See docs/rewards.md. Heads are imported lazily through :mod:`g2rpo.rewards.registry`.
"""
