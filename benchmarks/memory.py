"""Peak memory of one G²RPO rollout at FLUX.1-dev shapes: the conditioning gathered as copies
(before) against broadcast views (after).

The rollout conditions every model row on its prompt's embeddings. It used to gather them per call
with fancy indexing (``prompt_embeds[rows]``), which copies one 512 × 4096 bf16 row (4 MiB) per
latent row even when every row names the same prompt. ``FluxConditioning`` now takes rows with
:func:`g2rpo.core.take_rows`, which returns a broadcast view for one repeated prompt. This script
runs the project's own ``G2RPO.rollout`` at FLUX.1-dev shapes (720² images: 2025 packed tokens ×
64 channels; T5 ``[1, 512, 4096]`` and CLIP pooled ``[1, 768]`` in bf16; one prompt, G = 12,
T = 16, M = the 8 noisiest steps, Λ = {1, 2, 3}) with a velocity model that does no work, so the
numbers are the rollout's own memory plus what the conditioning costs a call.

**How "before" is measured.** ``before`` runs the same rollout code with
:class:`CopyingConditioning`, a ``FluxConditioning`` whose ``__getitem__`` is the project's previous
one, written out here (``prompt_embeds[index]``: a copy for any LongTensor index, a view for a
slice). ``after`` runs with ``FluxConditioning`` itself. Both record every gather made from the
rollout's conditioning: rows, whether it shares storage with the source, bytes copied.

**The do-nothing velocity model** (:class:`DoNothingVelocity`) returns ``zeros_like(x)`` (so x
stays noise; nothing depends on its values). What it does with the conditioning, per call:

- ``reads``: casts ``cond.prompt_embeds`` and ``cond.pooled_prompt_embeds`` to bf16 exactly as
  ``FluxVelocity.forward`` does (a no-op for bf16 embeddings: no copy) and nothing else. The peak
  is the rollout's own: latents, noise, velocities and the gathered conditioning.
- ``embedder``: also what the transformer's first text layer costs. ``context_embedder`` is a
  ``Linear(4096 → 3072)`` whose weight requires grad; ``F.linear`` then folds ``[B, S, 4096]`` into
  rows with ``reshape``, which copies a broadcast input to contiguous memory for that call. The
  model applies a ``Linear(4096 → 1)`` with a grad-requiring weight to the embeddings (the same
  input handling at 1/3072 of the compute) while holding a zero-filled ``[B, S, 3072]`` bf16
  tensor, the size of the embedder's output that the transformer keeps through its blocks.

Neither models the transformer blocks' activations (the same before and after, and far larger:
hundreds of MiB per row at 720²), so the absolute peaks are the sampler's and the conditioning's
share only.

**Peak measurement.** Each case runs in a fresh subprocess: it builds its inputs, runs the rollout
once on one token (so first-use allocations are not counted), resets the
kernel's high-water mark (writing ``5`` to ``/proc/self/clear_refs`` sets ``VmHWM`` to the current
``VmRSS``), runs the rollout, and reports ``VmHWM − VmRSS_before`` (resident memory, so every
copied page counts; a broadcast view allocates none). Where ``clear_refs`` cannot be written it
reports ``VmHWM − VmRSS_before`` without the reset and says so (``hwm_reset: false``).

Writes ``benchmarks/results/memory.json`` and prints a table.

Usage: ``python -m benchmarks.memory [--size 720] [--micro-batches 512 16] [--velocities reads embedder]``
(``--size 64 --seq 16 --dim 32`` for a quick check).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from benchmarks import peak_memory
from benchmarks.report import provenance, write_result
from g2rpo.models.flux import FluxConditioning, packed_shape
from g2rpo.seeding import Draws
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.g2rpo import G2RPO
from g2rpo.strategies.settings import G2RPOSettings

RESULTS = Path(__file__).resolve().parent / "results"
FLUX_INNER_DIM = 3072  # FLUX.1-dev's transformer width (context_embedder's output)
MIB = 2**20


@dataclass(frozen=True)
class GatherLog:
    """Every gather taken from the rollout's conditioning: (rows, shares storage, bytes copied)."""

    entries: list[tuple[int, bool, int]] = field(default_factory=list)

    def record(self, source: FluxConditioning, result: FluxConditioning) -> None:
        shares = result.prompt_embeds.untyped_storage().data_ptr() == source.prompt_embeds.untyped_storage().data_ptr()
        copied = (
            0
            if shares
            else sum(t.numel() * t.element_size() for t in (result.prompt_embeds, result.pooled_prompt_embeds))
        )
        self.entries.append((len(result), shares, copied))


@dataclass(frozen=True)
class RecordingConditioning(FluxConditioning):
    """``FluxConditioning`` (rows taken as views where they repeat a prompt) that logs its gathers."""

    log: GatherLog = field(default_factory=GatherLog, compare=False)

    def __getitem__(self, index):  # noqa: ANN001 - the parent's signature
        result = super().__getitem__(index)
        self.log.record(self, result)
        return result


@dataclass(frozen=True)
class CopyingConditioning(RecordingConditioning):
    """The project's previous ``FluxConditioning.__getitem__``: fancy indexing, a copy per gather."""

    def __getitem__(self, index):  # noqa: ANN001 - the parent's signature
        if isinstance(index, int):
            index = slice(index, index + 1) if index != -1 else slice(-1, None)
        elif not isinstance(index, (slice, torch.Tensor)):
            index = torch.as_tensor(list(index), dtype=torch.long)
        if isinstance(index, torch.Tensor):
            index = index.to(self.prompt_embeds.device)
        result = FluxConditioning(self.prompt_embeds[index], self.pooled_prompt_embeds[index])
        self.log.record(self, result)
        return result


class DoNothingVelocity:
    """v = 0 for every row; handles the conditioning as described in the module docstring."""

    def __init__(self, mode: str, joint_dim: int, inner_dim: int = FLUX_INNER_DIM, dtype: torch.dtype = torch.bfloat16):
        if mode not in ("reads", "embedder"):
            raise ValueError(f"velocity mode {mode!r}: use reads or embedder")
        self.mode, self.inner_dim, self.dtype = mode, inner_dim, dtype
        self.probe = nn.Linear(joint_dim, 1, dtype=dtype)  # requires grad, as a trained transformer's layers
        self.calls = 0

    def __call__(self, x: torch.Tensor, sigma: torch.Tensor, cond: FluxConditioning) -> torch.Tensor:
        self.calls += 1
        seq = cond.prompt_embeds.to(device=x.device, dtype=self.dtype)  # [B, S, D], as FluxVelocity.forward
        cond.pooled_prompt_embeds.to(device=x.device, dtype=self.dtype)  # [B, P]
        if self.mode == "embedder":
            text_stream = torch.zeros(seq.shape[0], seq.shape[1], self.inner_dim, dtype=self.dtype)  # [B, S, 3072]
            self.probe(seq)  # [B, S, 1]; F.linear copies a broadcast input while it runs, as context_embedder does
            del text_stream
        return torch.zeros_like(x)


def run_case(case: dict) -> dict:
    """One rollout in this process; returns its peak memory above the baseline and its gathers."""
    torch.set_num_threads(case["threads"])
    gen = torch.Generator().manual_seed(0)
    seq = torch.randn(1, case["seq"], case["dim"], generator=gen).to(torch.bfloat16)  # [1, S, D]
    pooled = torch.randn(1, case["pooled"], generator=gen).to(torch.bfloat16)  # [1, P]
    cls = CopyingConditioning if case["gather"] == "copy" else RecordingConditioning
    cond = cls(seq, pooled)
    config = AlgorithmConfig(
        num_steps=case["steps"],
        group_size=case["group"],
        micro_batch=case["micro_batch"],
        g2rpo=G2RPOSettings(granularities=case["strides"]),
    )
    strategy = G2RPO(config)
    model = DoNothingVelocity(case["velocity"], case["dim"])
    latent_shape = packed_shape(case["size"], case["size"])
    draws = Draws(run_seed=0, iteration=0, prompt_indices=(0,))
    # Warm-up on one token and one text position, so the first use of each op (lazy loading, caches)
    # happens before the high-water mark is reset.
    strategy.rollout(model, cls(seq[:, :1], pooled), draws, (1, latent_shape[1]))
    reset = peak_memory.reset_peak()
    before = peak_memory.status()
    start = time.perf_counter()
    rollout = strategy.rollout(model, cond, draws, latent_shape)
    seconds = time.perf_counter() - start
    after = peak_memory.status()
    gathers = cond.log.entries
    copies = [bytes_ for _, shares, bytes_ in gathers if not shares]
    return {
        **case,
        "peak_bytes": after["VmHWM"] - before["VmRSS"],
        "hwm_reset": reset,
        "seconds": seconds,
        "model_calls": rollout.nfe.model_calls,
        "sampling_forwards": rollout.nfe.sampling_forwards,
        "final_latents_bytes": rollout.final_latents.numel() * rollout.final_latents.element_size(),
        "gathers": len(gathers),
        "gathers_copied": len(copies),
        "copied_bytes_total": sum(copies),
        "copied_bytes_largest": max(copies, default=0),
        "gathered_rows": [rows for rows, _, _ in gathers],
    }


def _subprocess_case(case: dict) -> dict:
    """``run_case`` in a fresh interpreter, so each peak starts from a clean heap."""
    return peak_memory.run_case("benchmarks.memory", case)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=720, help="image side in pixels (FLUX.1-dev run: 720)")
    parser.add_argument("--seq", type=int, default=512, help="T5 sequence length (FLUX.1-dev: 512)")
    parser.add_argument("--dim", type=int, default=4096, help="T5 width (FLUX.1-dev: 4096)")
    parser.add_argument("--pooled", type=int, default=768, help="CLIP pooled width (FLUX.1-dev: 768)")
    parser.add_argument("--steps", type=int, default=16, help="T (paper 16)")
    parser.add_argument("--group", type=int, default=12, help="G (paper 12)")
    parser.add_argument("--strides", type=int, nargs="+", default=[1, 2, 3], help="Λ (paper 1 2 3)")
    parser.add_argument(
        "--micro-batches", type=int, nargs="+", default=[512, 16], help="rows per model call (512: every call whole)"
    )
    parser.add_argument("--velocities", nargs="+", default=["reads", "embedder"], choices=["reads", "embedder"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", type=Path, default=RESULTS / "memory.json")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # internal: run one case, print its JSON
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))))
        return 0
    started = time.perf_counter()
    shared = {
        "size": args.size,
        "seq": args.seq,
        "dim": args.dim,
        "pooled": args.pooled,
        "steps": args.steps,
        "group": args.group,
        "strides": args.strides,
        "threads": args.threads,
    }
    cases = []
    for velocity in args.velocities:
        for micro in args.micro_batches:
            pair = {}
            for gather in ("copy", "view"):
                pair[gather] = _subprocess_case(
                    {**shared, "velocity": velocity, "micro_batch": micro, "gather": gather}
                )
            cases.append(
                {
                    "velocity": velocity,
                    "micro_batch": micro,
                    "before": pair["copy"],
                    "after": pair["view"],
                    "peak_ratio": pair["view"]["peak_bytes"] / max(pair["copy"]["peak_bytes"], 1),
                }
            )
    result = {
        "benchmark": "memory",
        **provenance("benchmarks.memory", argv, started),
        "settings": {**shared, "micro_batches": args.micro_batches, "velocities": args.velocities},
        "latent_shape": list(packed_shape(args.size, args.size)),
        "measurement": "fresh subprocess per case; VmHWM after the rollout minus VmRSS before it, HWM reset via /proc/self/clear_refs",
        "cases": cases,
    }
    write_result(result, args.output, table)
    return 0


def table(result: dict) -> str:
    s = result["settings"]
    lines = [
        f"G²RPO rollout, {s['size']}² images (latents {result['latent_shape']}), T5 [1, {s['seq']}, {s['dim']}] bf16, "
        f"G={s['group']}, T={s['steps']}, Λ={s['strides']}; peak = VmHWM − VmRSS before the rollout",
        f"{'velocity':<9} {'micro':>5} | {'before MiB':>10} {'after MiB':>10} {'after/before':>12} | "
        f"{'copies before':>13} {'GiB copied':>10} {'largest MiB':>11} | {'copies after':>12}",
    ]
    for c in result["cases"]:
        b, a = c["before"], c["after"]
        lines.append(
            f"{c['velocity']:<9} {c['micro_batch']:>5} | {b['peak_bytes'] / MIB:>10.0f} {a['peak_bytes'] / MIB:>10.0f} "
            f"{c['peak_ratio']:>12.2f} | {b['gathers_copied']:>13} {b['copied_bytes_total'] / 2**30:>10.2f} "
            f"{b['copied_bytes_largest'] / MIB:>11.0f} | {a['gathers_copied']:>12}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
