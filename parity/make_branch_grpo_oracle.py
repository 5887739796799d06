"""Write tests/fixtures/oracle/branch_grpo_tree_advantages.json: BranchGRPO's own tree advantages on tiny trees.

Run by hand with the published training script of Fredreic1849/BranchGRPO (commit ffc3c90, the one
that added it; the fixture records the commit given):

    OMP_NUM_THREADS=1 .venv/bin/python parity/make_branch_grpo_oracle.py \\
        BRANCHGRPO/fastvideo/train_branchgrpo_flux.py ffc3c90... OUT.json

Nothing of that script is kept here. It takes, as text (found with ``ast``), the class ``TreeNode``
and the functions ``compute_node_rewards_from_leaves`` (a node's reward = mean of its leaves') and
``compute_hierarchical_advantages_by_depth`` (normalised within each depth), runs them on small
trees built the way ``run_tree_sample_step`` builds them (every node gets one child per step, two at
a split step, children appended in order), and stores each case's grid, split points, leaf rewards
and the advantages of every depth in the order the script lists the nodes.
tests/core/test_core_branchgrpo.py checks g2rpo.core.tree_advantages against them.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Dict, List  # noqa: UP035 - the published functions' annotations name them

import numpy as np
import torch

NAMES = ("TreeNode", "compute_node_rewards_from_leaves", "compute_hierarchical_advantages_by_depth")
CASES = [  # (T, split points, leaf rewards; None = seeded random)
    (5, [0, 2], None),
    (6, [0, 1, 3], None),
    (4, [1, 2], [1.0, 3.0, 3.0, 1.0]),  # depth 2's two values are equal: zeros there
    (3, [0], [0.5, 0.5]),  # one constant depth after another
]


def published(script: str) -> dict:
    tree = ast.parse(script)
    namespace: dict = {"torch": torch, "np": np, "List": List, "Dict": Dict, "main_print": lambda *a, **k: None}
    for node in tree.body:
        if isinstance(node, ast.ClassDef | ast.FunctionDef) and node.name in NAMES:
            exec(compile(ast.get_source_segment(script, node), f"published:{node.name}", "exec"), namespace)
    return namespace


def build_tree(ns: dict, steps: int, splits: list[int]):
    root = ns["TreeNode"]("root_b0", torch.zeros(1), parent=None, step=0, batch_idx=0)
    current = [root]
    for i in range(steps):
        new = []
        for node in current:
            for c in range(2 if i in splits else 1):
                child = ns["TreeNode"](f"{node.node_id}_{i}_{c}", torch.zeros(1), parent=node, step=i + 1, batch_idx=0)
                node.add_child(child)
                new.append(child)
        current = new
    return root, current


def main(source: str, commit: str, out: str) -> None:
    ns = published(Path(source).read_text(encoding="utf-8"))
    gen = torch.Generator().manual_seed(0)
    record = {
        "reference": f"Fredreic1849/BranchGRPO@{commit} fastvideo/train_branchgrpo_flux.py::"
        "compute_node_rewards_from_leaves, compute_hierarchical_advantages_by_depth",
        "cases": [],
    }
    for steps, splits, given in CASES:
        root, leaves = build_tree(ns, steps, splits)
        rewards = torch.tensor(given) if given is not None else torch.rand(len(leaves), generator=gen)
        _, by_depth = ns["compute_node_rewards_from_leaves"](root, rewards, leaves)
        ns["compute_hierarchical_advantages_by_depth"](by_depth)
        record["cases"].append(
            {
                "num_steps": steps,
                "split_points": splits,
                "rewards": rewards.tolist(),
                "advantages_by_depth": [[float(n.advantage) for n in by_depth[d]] for d in sorted(by_depth)],
            }
        )
    Path(out).write_text(json.dumps(record, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
