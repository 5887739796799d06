"""Run under torchrun by test_trainer_deepspeed.py: train the tiny model with DeepSpeed and dump
this rank's parameters and the prompts it trained (argv: model dir, output dir, zero stage)."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_testlib import tiny_overrides  # noqa: E402

from g2rpo.config import load_config  # noqa: E402
from g2rpo.run_config import RunConfig  # noqa: E402
from g2rpo.trainer import Trainer  # noqa: E402


def main() -> None:
    model, out, stage = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    config = load_config(
        RunConfig,
        None,
        tiny_overrides(
            model,
            out,
            **{"deepspeed.enabled": True, "deepspeed.zero_stage": stage, "train.iterations": 3,
               "train.prompts_per_iteration": 4, "train.checkpoint_every": 100, "output.export": False},
        ),
    )
    trainer = Trainer(config).setup()
    start = {n: p.detach().clone() for n, p in trainer.driver.module.named_parameters()}
    prompts = []
    for _ in range(config.train.iterations):
        prompts.append(trainer.step().prompt_indices)
    end = {n: p.detach().clone() for n, p in trainer.driver.module.named_parameters()}
    torch.save({"start": start, "end": end, "prompts": prompts}, out / f"rank-{trainer.ctx.rank}.pt")


if __name__ == "__main__":
    main()
