"""g2rpo — G²RPO (Granular-GRPO) preference alignment for flow-matching text-to-image models.

Layers (arrows point to what a layer may import; see docs/architecture.md):

    cli -> trainer, evaluation, registry, data, models, rewards, storage, metrics
    trainer -> strategies -> core        (core: pure tensor math, imports torch and g2rpo.strides only)
"""

__version__ = "0.1.0"
