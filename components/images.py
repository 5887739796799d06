"""The container images the components run in: named here and nowhere else.

Both are built from ``images/`` at the package's version. ``g2rpo`` holds the library and its CPU
dependencies (prepare, decide, promote, report); ``g2rpo-trainer`` adds CUDA, DeepSpeed and the reward
weights' runtime (train, evaluate). kfp.local ignores them and runs each component in this interpreter.
"""

from g2rpo import __version__

REGISTRY = "ghcr.io/g2rpo"
G2RPO_IMAGE = f"{REGISTRY}/g2rpo:{__version__}"
TRAINER_IMAGE = f"{REGISTRY}/g2rpo-trainer:{__version__}"
