"""Run under torchrun by test_trainer_deepspeed.py: train the tiny model with DeepSpeed and dump
this rank's parameters and the prompts it trained (argv: model dir, output dir, zero stage, and
optionally ``nan-rank1``: rank 1's reward returns NaN, so all its groups are dropped and it yields
no loss terms while rank 0 yields its usual ones; ``iterations=N``: train N iterations instead of 3).
Each rank also records the paired reward probe (same draws) before and after training, and what
a trainer callback saw on that rank (rank, iteration, prompts of each record)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_testlib import probe_reward, tiny_overrides  # noqa: E402

from g2rpo.config import load_config  # noqa: E402
from g2rpo.rewards.base import RewardModel  # noqa: E402
from g2rpo.training.callbacks import TrainerCallback  # noqa: E402
from g2rpo.training.metrics import IterationRecord  # noqa: E402
from g2rpo.training.run_config import RunConfig  # noqa: E402
from g2rpo.training.trainer import Trainer  # noqa: E402


class NaNReward(RewardModel):
    """A reward that fails on every image (as a broken reward model would)."""

    name = "nan_reward"
    needs_prompts = False

    def _score(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return torch.full((images.shape[0],), float("nan"))


class SeenOnThisRank(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[tuple[int, int, list[int]]] = []

    def on_iteration_end(self, trainer: Trainer, record: IterationRecord) -> None:
        self.seen.append((trainer.ctx.rank, record.iteration, record.prompt_indices))


def main() -> None:
    model, out, stage = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    options = sys.argv[4:]
    iterations = next((int(o.split("=", 1)[1]) for o in options if o.startswith("iterations=")), 3)
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
                "train.prompts_per_iteration": 4,
                "train.checkpoint_every": 100,
                "output.export": False,
            },
        ),
    )
    callback = SeenOnThisRank()
    trainer = Trainer(config, callbacks=[callback]).setup()
    if "nan-rank1" in options and trainer.ctx.rank == 1:
        trainer.reward_set = replace(trainer.reward_set, models=[NaNReward()])
    start = {n: p.detach().clone() for n, p in trainer.learner.driver.module.named_parameters()}
    probe_before = probe_reward(trainer)  # paired: the same draws before and after (no collectives)
    prompts, dropped = [], []
    for _ in range(config.train.iterations):
        record = trainer.step()
        prompts.append(record.prompt_indices)
        dropped.append((record.stats.dropped_groups, record.stats.total_groups, record.stats.optimizer_steps))
    end = {n: p.detach().clone() for n, p in trainer.learner.driver.module.named_parameters()}
    probe_after = probe_reward(trainer)
    torch.save(
        {
            "start": start,
            "end": end,
            "prompts": prompts,
            "dropped": dropped,
            "probe": (probe_before, probe_after),
            "callback": callback.seen,
        },
        out / f"rank-{trainer.ctx.rank}.pt",
    )


if __name__ == "__main__":
    main()
