"""Training: the written-out G²RPO loop (:mod:`~g2rpo.training.trainer`), its optimiser drivers,
resumable checkpoints and exports, the DeepSpeed config, the distributed set-up and the run config."""
