"""Write tests/fixtures/oracle/flow_grpo_sde_step.json: Flow-GRPO's own SDE step on tiny inputs.

Run by hand with a checkout of yifan123/flow_grpo (the fixture records the commit, ac4c86e):

    OMP_NUM_THREADS=1 .venv/bin/python parity/make_flow_grpo_oracle.py FLOW_GRPO_CHECKOUT OUT.json

It imports ``flow_grpo/diffusers_patch/sd3_sde_with_logprob.py`` from that checkout (nothing of it
is kept here), runs ``sde_step_with_logprob`` at each of 4 steps of diffusers'
``FlowMatchEulerDiscreteScheduler(shift=3)`` with noise level 0.7, and stores its inputs and
outputs; tests/core/test_core_flowgrpo.py checks g2rpo.core against them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import torch
from diffusers import FlowMatchEulerDiscreteScheduler


def main(checkout: str, out: str) -> None:
    source = Path(checkout) / "flow_grpo" / "diffusers_patch" / "sd3_sde_with_logprob.py"
    spec = importlib.util.spec_from_file_location("flow_grpo_sde", source)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    scheduler.set_timesteps(4)
    gen = torch.Generator().manual_seed(0)
    x, v = torch.randn(3, 2, 2, 2, generator=gen), torch.randn(3, 2, 2, 2, generator=gen)
    record = {
        "reference": f"yifan123/flow_grpo@{commit} flow_grpo/diffusers_patch/sd3_sde_with_logprob.py::sde_step_with_logprob",
        "sigmas": scheduler.sigmas.tolist(),
        "x": x.tolist(),
        "v": v.tolist(),
        "eta": 0.7,
        "steps": [],
    }
    for i in range(4):
        t = scheduler.timesteps[i].expand(3)
        sample, log_prob, mean, std = module.sde_step_with_logprob(
            scheduler, v, t, x, noise_level=0.7, generator=torch.Generator().manual_seed(i)
        )
        record["steps"].append(
            {"step": i, "prev_sample": sample.tolist(), "log_prob": log_prob.tolist(), "mean": mean.tolist(), "std": std.flatten().tolist()}
        )
    Path(out).write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
