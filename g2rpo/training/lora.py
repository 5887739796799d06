"""Which modules LoRA adapters go on: ``train.lora.target_modules`` checked against a transformer.

peft matches a target name against the end of every module's dotted name and adapts Linear,
Embedding and Conv layers only. A target that matches nothing, or matches another kind of module
(a norm, a whole block), failed inside peft at set-up — on a cluster, after the pods started. The
same check runs in ``g2rpo validate`` (on the model's skeleton, built on the meta device without
its weights: :func:`g2rpo.models.loading.transformer_skeleton`) and when the adapters are added.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

import torch

from g2rpo.errors import problem

__all__ = ["lora_target_problem"]

FIELD = "train.lora.target_modules"
_SUPPORTED = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)


def _matches(name: str, target: str) -> bool:
    return name == target or name.endswith("." + target)


def lora_target_problem(transformer: torch.nn.Module, target_modules: Sequence[str]) -> str | None:
    """What is wrong with ``target_modules`` for ``transformer`` (``field=value: fix``), or None."""
    modules = {n: m for n, m in transformer.named_modules() if n}
    targets = list(target_modules)
    missing = [t for t in targets if not any(_matches(n, t) for n in modules)]
    if missing:
        suffixes = sorted({".".join(n.split(".")[-k:]) for n in modules for k in (1, 2)})
        hints = {t: difflib.get_close_matches(t, suffixes, n=4) for t in missing}
        detail = "; ".join(f"{t!r} (close: {', '.join(h) or 'none'})" for t, h in hints.items())
        return problem(
            FIELD,
            targets,
            f"no module of the transformer matches {detail}; use names of its Linear layers, e.g. to_q, to_k, to_v, "
            "to_out.0",
        )
    unsupported = {
        t: sorted({type(m).__name__ for n, m in modules.items() if _matches(n, t) and not isinstance(m, _SUPPORTED)})
        for t in targets
    }
    unsupported = {t: kinds for t, kinds in unsupported.items() if kinds}
    if unsupported:
        detail = "; ".join(f"{t!r} matches {' and '.join(kinds)} modules" for t, kinds in unsupported.items())
        return problem(
            FIELD,
            targets,
            f"LoRA adapts Linear layers only: {detail}; name Linear layers, e.g. to_q, to_k, to_v, to_out.0 "
            "(or the Linear inside a module, e.g. norm1.linear)",
        )
    return None
