"""Write tests/fixtures/oracle/diffusion_nft_loss.json: DiffusionNFT's own loss, decay and advantages on tiny inputs.

Run by hand with a checkout of NVlabs/DiffusionNFT (the fixture records the commit, 24af555):

    OMP_NUM_THREADS=1 .venv/bin/python parity/make_diffusion_nft_oracle.py NFT_CHECKOUT OUT.json

Nothing of that checkout is kept here. From ``scripts/train_nft_sd3.py`` it takes, as text, the
function ``return_decay`` (found with ``ast``) and the lines of the training loop from
``loss_terms = {}`` to ``loss += config.train.beta * ...`` (the advantage → r normalisation, the
positive/negative predictions, the adaptive weighting, the policy loss and the KL term), and runs
them on tiny tensors with the names the loop gives them (``x0``, ``xt``, ``t_expanded``,
``forward_prediction``, ``old_prediction``, ``ref_forward_prediction``, ``train_sample_batch``, a
``config`` with ``beta``, ``train.adv_clip_max``, ``train.adv_mode``, ``train.beta``). It stores the
inputs, the loop's variables after the block and the gradient of ``loss`` with respect to
``forward_prediction``. From ``flow_grpo/stat_tracking.py`` it runs ``PerPromptStatTracker`` (the
per-prompt advantage with the batch std). tests/core/test_core_diffusionnft.py checks g2rpo against them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

FIRST = "loss_terms = {}"
LAST = "loss += config.train.beta * torch.mean(kl_div_loss)"


def loss_block(script: str) -> str:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == FIRST)
    stop = next(i for i in range(start, len(lines)) if lines[i].strip() == LAST)
    return textwrap.dedent("\n".join(lines[start : stop + 1]))


def function_source(script: str, name: str) -> str:
    tree = ast.parse(script)
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.get_source_segment(script, node)


def main(checkout: str, out: str) -> None:
    root = Path(checkout)
    script = (root / "scripts" / "train_nft_sd3.py").read_text(encoding="utf-8")
    commit = subprocess.run(["git", "-C", checkout, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    block = compile(loss_block(script), "train_nft_sd3.py:loss", "exec")
    decay_ns: dict = {}
    exec(compile(function_source(script, "return_decay"), "train_nft_sd3.py:return_decay", "exec"), decay_ns)

    record = {
        "reference": f"NVlabs/DiffusionNFT@{commit} scripts/train_nft_sd3.py (the loss lines of the training loop, "
        "return_decay) and flow_grpo/stat_tracking.py::PerPromptStatTracker",
        "adv_clip_max": 5.0,
        "loss_cases": [],
    }
    gen = torch.Generator().manual_seed(0)
    batch, shape = 4, (4, 2, 3, 2)  # [B, C, H, W] as the script's latents; the loss means over all but dim 0
    x0 = torch.randn(shape, generator=gen)
    noise = torch.randn(shape, generator=gen)
    t = torch.tensor([1.0, 0.75, 0.4, 0.05])  # [B] σ of each sample's trained timestep
    t_expanded = t.view(-1, 1, 1, 1)
    xt = (1 - t_expanded) * x0 + t_expanded * noise
    old = torch.randn(shape, generator=gen)
    current = old + 0.3 * torch.randn(shape, generator=gen)
    ref = old + 0.2 * torch.randn(shape, generator=gen)
    advantages = torch.tensor([-7.0, -1.5, 0.3, 6.0], dtype=torch.float64)  # [B], two beyond the clip
    for beta in (1.0, 0.1):
        forward_prediction = current.clone().requires_grad_(True)
        config = SimpleNamespace(beta=beta, train=SimpleNamespace(adv_clip_max=5, adv_mode="all", beta=1e-4))
        ns = {
            "torch": torch,
            "config": config,
            "train_sample_batch": {"advantages": advantages[:, None]},
            "j_idx": 0,
            "x0": x0,
            "xt": xt,
            "t_expanded": t_expanded,
            "forward_prediction": forward_prediction,
            "old_prediction": old,
            "ref_forward_prediction": ref,
        }
        exec(block, ns)
        ns["loss"].backward()
        record["loss_cases"].append(
            {
                "beta": beta,
                "kl_beta": config.train.beta,
                "r": ns["r"].tolist(),
                "positive_loss": ns["positive_loss"].tolist(),
                "negative_loss": ns["negative_loss"].tolist(),
                "ori_policy_loss": ns["ori_policy_loss"].tolist(),
                "policy_loss": float(ns["policy_loss"]),
                "kl_div_loss": ns["kl_div_loss"].tolist(),
                "loss": float(ns["loss"]),
                "grad_forward_prediction": forward_prediction.grad.tolist(),
            }
        )
    record.update(
        x0=x0.tolist(),
        xt=xt.tolist(),
        t=t.tolist(),
        old_prediction=old.tolist(),
        forward_prediction=current.tolist(),
        ref_forward_prediction=ref.tolist(),
        advantages=advantages.tolist(),
    )
    steps = [0, 1, 2, 74, 75, 76, 100, 300, 499, 500, 501, 1000, 5000]
    record["decay"] = {
        "steps": steps,
        **{str(kind): [decay_ns["return_decay"](s, kind) for s in steps] for kind in (0, 1, 2)},
    }

    spec = importlib.util.spec_from_file_location("nft_stat_tracking", root / "flow_grpo" / "stat_tracking.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    prompts = ["a", "a", "a", "b", "b", "b", "c", "c", "c"]  # 3 prompts × G = 3, in prompt-major order
    rewards = np.array([0.2, 0.9, 0.4, 1.0, 1.0, 1.0, -0.5, 0.1, 0.3])
    record["stat_tracker"] = {"prompts": prompts, "rewards": rewards.tolist()}
    for global_std in (True, False):
        tracker = module.PerPromptStatTracker(global_std)
        record["stat_tracker"][f"advantages_global_std_{global_std}".lower()] = tracker.update(prompts, rewards).tolist()
    Path(out).write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
