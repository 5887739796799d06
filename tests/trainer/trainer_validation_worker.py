"""Run under torchrun by test_trainer_validation.py: set up a DeepSpeed trainer on the tiny model and
run one validation pass (argv: model dir, output dir, dump file, micro batch); rank 0 writes the
record, every rank the chunks it sampled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from trainer_testlib import tiny_overrides  # noqa: E402

from g2rpo.config import load_config  # noqa: E402
from g2rpo.training.run_config import RunConfig  # noqa: E402
from g2rpo.training.trainer import Trainer  # noqa: E402
from g2rpo.training.validation import validation_chunks  # noqa: E402


def main() -> None:
    model, out, dump, micro_batch = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
    overrides = tiny_overrides(
        model,
        out,
        **{
            "deepspeed.enabled": True,
            "deepspeed.zero_stage": 2,
            "train.prompts_per_iteration": 2,
            "output.export": False,
        },
    )
    overrides["train"]["validation"] = {
        "enabled": True,
        "num_prompts": 3,
        "seeds": [0, 1],
        "micro_batch": micro_batch,
    }
    overrides["rewards"]["models"] = [{"name": "jpeg_compressibility"}, {"name": "sharpness", "weight": 0.0}]
    trainer = Trainer(load_config(RunConfig, None, overrides)).setup()
    record = trainer.validate()
    ctx = trainer.ctx
    chunks = len(validation_chunks(3 * 2, micro_batch))
    mine = list(range(ctx.rank, chunks, ctx.world_size))
    Path(f"{dump}.rank{ctx.rank}").write_text(json.dumps(mine))
    if ctx.is_main:
        dump.write_text(json.dumps({"world_size": ctx.world_size, "record": record.as_json()}))
    ctx.shutdown()


if __name__ == "__main__":
    main()
