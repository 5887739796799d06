"""Launching training beyond one node: a Kubeflow Trainer v2 ``TrainJob`` (:mod:`~g2rpo.launch.trainjob`)."""
