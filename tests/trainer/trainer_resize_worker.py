"""Run under torchrun by test_trainer_world_size.py: set up a DeepSpeed trainer in an output dir
(resuming from its latest checkpoint, whatever world size wrote it), record every trainable
parameter's fp32 master weights and Adam moments as DeepSpeed holds them right after setup, train
up to ``iterations``, and record them again at the end (argv: model dir, output dir, zero stage,
iterations, dump file, precision). Rank 0 writes the dump.

The states are read with DeepSpeed's ``safe_get_full_*`` (collective: every rank calls them), so
a dump compares whole tensors whatever the partitioning was.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_testlib import tiny_overrides  # noqa: E402

from g2rpo.config import load_config  # noqa: E402
from g2rpo.training.run_config import RunConfig  # noqa: E402
from g2rpo.training.trainer import Trainer  # noqa: E402


def optimiser_state(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    """Per trainable parameter: fp32 master weights, Adam moments, module weights ({} before the first step)."""
    if not trainer.learner.driver.engine.optimizer.optimizer.state:
        return {}
    out = {}
    for name, param in trainer.learner.driver.module.named_parameters():
        if param.requires_grad:
            out[name] = {
                "fp32": safe_get_full_fp32_param(param).clone(),
                "exp_avg": safe_get_full_optimizer_state(param, "exp_avg").clone(),
                "exp_avg_sq": safe_get_full_optimizer_state(param, "exp_avg_sq").clone(),
                "module": param.detach().clone(),  # ZeRO-3 leaves this tiny model's tensors whole (< 1e5 elements)
            }
    return out


def main() -> None:
    model, out, stage, iterations, dump, precision = (
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        int(sys.argv[4]),
        Path(sys.argv[5]),
        sys.argv[6],
    )
    config = load_config(
        RunConfig,
        None,
        tiny_overrides(
            model,
            out,
            **{
                "deepspeed.enabled": True,
                "deepspeed.zero_stage": stage,
                "train.iterations": iterations,
                "train.precision": precision,
                "train.prompts_per_iteration": 4,
                "train.checkpoint_every": 2,
                "output.export": False,
            },
        ),
    )
    trainer = Trainer(config).setup()
    start = {"iteration": trainer.iteration, "state": optimiser_state(trainer)}
    records = []
    while trainer.iteration < iterations:
        record = trainer.step()
        records.append(
            {"iteration": record.iteration, "loss": record.stats.loss, "optimizer_steps": record.stats.optimizer_steps}
        )
    end = {"iteration": trainer.iteration, "state": optimiser_state(trainer)}
    engine = trainer.learner.driver.engine
    adam_steps = sorted({float(s["step"]) for s in engine.optimizer.optimizer.state.values()})  # AdamW's count
    result = {
        "adam_steps": adam_steps,
        "world_size": trainer.ctx.world_size,
        "start": start,
        "end": end,
        "records": records,
        "global_steps": engine.global_steps,
    }
    if trainer.ctx.is_main:
        torch.save(result, dump)
    # setup() took the writer claim on output.dir; run() gives it back, a caller of step() does (else the
    # folder keeps this dead process's claim for the next run to take over).
    trainer.release_claims()
    trainer.ctx.shutdown()


if __name__ == "__main__":
    main()
