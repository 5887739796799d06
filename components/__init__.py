"""KFP v2 components: thin wrappers, one per pipeline step, over ``g2rpo.steps`` (see README.md).

Loaded from the source tree, never installed as a top-level package."""
