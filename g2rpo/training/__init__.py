"""Training: the written-out G²RPO loop (:mod:`~g2rpo.training.trainer`), its optimiser drivers, LoRA
and EMA (:mod:`~g2rpo.training.drivers`), resumable checkpoints and exports, the DeepSpeed config, the
distributed set-up, the run config, the ``metrics.jsonl`` reader and the fail points of the resume
tests."""
