"""The run config is data: importing it, and the config sections it is built from, loads no torch.

`g2rpo config`, `g2rpo validate` and the pipeline's parameter checks read the config before they
need a tensor; torch (with the checkpoint manager and the Flux model it dragged in through
``run_config -> validation -> checkpoint``) cost them seconds before their first line. Each import
runs in a fresh interpreter, so what this test process already loaded cannot hide a chain.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Imports the module named by argv[1] and prints the chain of module-level imports that first asked
# for torch ("a -> b -> torch"), or nothing when torch was never asked for.
PROBE = r"""
import importlib
import sys


class FirstImportOf:
    def __init__(self, name):
        self.name, self.chain = name, None

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.name and self.chain is None:
            frame, chain = sys._getframe(1), []
            while frame is not None:
                if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") != "__main__":
                    chain.append(frame.f_globals["__name__"])
                frame = frame.f_back
            self.chain = [*reversed(chain), fullname]
        return None


spy = FirstImportOf("torch")
sys.meta_path.insert(0, spy)
importlib.import_module(sys.argv[1])
assert ("torch" in sys.modules) == (spy.chain is not None), "the probe missed an import of torch"
print(" -> ".join(spy.chain or []))
"""


def torch_import_chain(module: str) -> str:
    """The chain through which importing ``module`` in a fresh interpreter loads torch ("" when it does not)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, module], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.parametrize(
    "module",
    [
        "g2rpo.training.run_config",
        "g2rpo.strategies.config",
        "g2rpo.strategies.settings",
        "g2rpo.rewards.config",
        "g2rpo.rewards.specs",
        "g2rpo.training.deepspeed_config",
    ],
)
def test_config_modules_import_no_torch(module):
    chain = torch_import_chain(module)
    assert chain == "", f"`import {module}` loads torch through {chain}: import the torch-free module instead"


def test_the_probe_names_the_chain_that_loads_torch():
    # The strategies themselves need torch: the probe must see it, and name the path it came by.
    chain = torch_import_chain("g2rpo.strategies.registry").split(" -> ")
    assert chain[0] == "g2rpo.strategies.registry" and chain[-1] == "torch" and len(chain) >= 3, chain


# Validates a run config whose rewards name heads that load torch models (open_clip, BLIP, a
# Qwen2.5-VL judge), a valid one and one with a problem in every reward entry, then says whether torch
# was loaded. The reward section reads each head's spec (name, keys, dtype); building the head, which
# needs torch, is another step (g2rpo.rewards.registry).
VALIDATE_REWARDS = r"""
import sys

from g2rpo.errors import ConfigError
from g2rpo.training.run_config import load_run_config

models = (
    "rewards.models=[{name: hps_v21, weights: /nowhere/HPS_v2.1_compressed.pt, arch: ViT-H-14},"
    " {name: image_reward, weights: /nowhere, tokenizer: /nowhere/tokenizer},"
    " {name: unified_reward_score, weights: /nowhere, dtype: auto, max_new_tokens: 64},"
    " {name: aesthetic, weights: /nowhere/mlp.pth, backbone: /nowhere/clip, weight: 0.5}]"
)
config = load_run_config("configs/tiny-cpu.yaml", [models])
print([m.name for m in config.rewards.models])
bad = (
    "rewards.models=[{name: hps_v2, weights: /nowhere}, {name: clip, backbone: /nowhere},"
    " {name: pickscore, dtype: auto}]"
)
try:
    load_run_config("configs/tiny-cpu.yaml", [bad])
except ConfigError as exc:
    print(len(exc.problems))
print("torch" in sys.modules)
"""


def test_validating_a_config_with_model_rewards_imports_no_torch():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-c", VALIDATE_REWARDS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    names, problems, torch_loaded = done.stdout.split("\n")[:3]
    # The valid config came through, and the bad one was refused once per bad entry (the checks ran).
    assert names == "['hps_v21', 'image_reward', 'unified_reward_score', 'aesthetic']", done.stdout
    assert problems == "3", done.stdout
    assert torch_loaded == "False", "validating the rewards section loaded torch"
