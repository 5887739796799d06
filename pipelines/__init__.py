"""KFP DAG definitions over ``components`` and their compiled YAML (see README.md).

Loaded from the source tree, never installed as a top-level package."""
