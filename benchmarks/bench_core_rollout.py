"""G²RPO rollout cost on the tiny real Flux: batched branches × strides vs one row per model call.

The same rollout (same draws, same forwards, same result) is run twice with the same loaded
``FluxTransformer2DModel`` behind :class:`g2rpo.models.flux.FluxVelocity`:

- ``batched``: ``micro_batch`` rows per call (branches, steps and strides at different σ together);
- ``batch1``: ``micro_batch = 1`` — one image per call, as the reference code runs its branches.

It also reports the forward counts of this project's rollout (anchor stopped at the last branch
step, first finishing forward shared between strides) against the reference code's
(full anchor, one extra forward at x[k] per branch, no sharing) for the same settings — counts,
not timings, so they hold at any model size.

Timing: ``time.perf_counter``, one warm-up, best of ``--repeats``; ``torch`` on ``--threads``
threads. Writes ``benchmarks/results/bench_core_rollout.json`` and prints a table. At tiny size a
forward costs about as much as the Python around it, so the ratio measures per-call overhead that
batching removes; on a GPU at Flux size batching mostly keeps the device busy instead.

Usage: ``python -m benchmarks.bench_core_rollout [--steps 8] [--group 6] [--size 64] [--repeats 2]``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def reference_forwards(num_steps: int, group: int, steps: list[int], strides: list[int]) -> int:
    """Forwards per prompt of the reference code's sampler (``bcmi/Granular-GRPO``): the anchor runs
    all T steps; each branch recomputes v at x[k] for its SDE step, then runs every stride's
    schedule ``σ[:k+2] + σ[k+2::λ]`` from index k+1 (len − k − 2 forwards each, nothing shared)."""
    total = num_steps
    for k in steps:
        per_branch = 1
        for lam in strides:
            schedule_len = (k + 2) + len(range(k + 2, num_steps + 1, lam))
            per_branch += schedule_len - k - 2
        total += group * per_branch
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="T")
    parser.add_argument("--group", type=int, default=6, help="G")
    parser.add_argument("--strides", default="1,2,3", help="Λ, comma-separated")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--size", type=int, default=64, help="image height = width (64 → 16 packed tokens)")
    parser.add_argument("--micro-batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from g2rpo.models.flux import FluxTextEncoder, FluxVelocity
    from g2rpo.models.tiny import build_tiny_flux_pipeline
    from g2rpo.seeding import Draws
    from g2rpo.strategies import build_strategy
    from g2rpo.strategies.config import AlgorithmConfig
    from g2rpo.strategies.g2rpo import G2RPOSettings, sampling_forwards

    pipe = build_tiny_flux_pipeline(seed=0)
    model = FluxVelocity(pipe.transformer, height=args.size, width=args.size)
    cond = FluxTextEncoder.from_pipeline(pipe).encode([f"prompt number {i}" for i in range(args.prompts)])
    strides = [int(s) for s in args.strides.split(",")]
    draws = Draws(0, 0, tuple(range(args.prompts)))
    rows = []
    finals = {}
    for name, micro in (("batched", args.micro_batch), ("batch1", 1)):
        config = AlgorithmConfig(
            num_steps=args.steps, group_size=args.group, micro_batch=micro, g2rpo=G2RPOSettings(granularities=strides)
        )
        strategy = build_strategy(config)

        def run(strategy=strategy):
            with torch.no_grad():
                return strategy.rollout(model, cond, draws, model.latent_shape)

        rollout = run()  # warm-up
        best = math.inf
        for _ in range(args.repeats):
            start = time.perf_counter()
            rollout = run()
            best = min(best, time.perf_counter() - start)
        finals[name] = rollout.final_latents
        rows.append(
            {
                "mode": name,
                "micro_batch": micro,
                "sampling_forwards": rollout.nfe.sampling_forwards,
                "model_calls": rollout.nfe.model_calls,
                "seconds": best,
            }
        )
    trained_steps = G2RPOSettings(granularities=strides).all_branch_steps(args.steps)  # M
    ours = sampling_forwards(args.steps, args.group, trained_steps, strides)
    reference = reference_forwards(args.steps, args.group, trained_steps, strides)
    result = {
        "benchmark": "bench_core_rollout",
        "settings": {**vars(args), "latent_shape": list(model.latent_shape), "trained_steps": trained_steps},
        "machine": {"platform": platform.platform(), "torch": torch.__version__},
        "runs": rows,
        "speedup_batched_vs_batch1": rows[1]["seconds"] / rows[0]["seconds"],
        "same_result": bool(torch.allclose(finals["batched"], finals["batch1"], atol=1e-4, rtol=1e-4)),
        "forwards_per_prompt": {"this_project": ours, "reference_code": reference},
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / "bench_core_rollout.json"
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(
        f"G²RPO rollout, tiny Flux {args.size}×{args.size}, T={args.steps} G={args.group} Λ={strides} "
        f"|M|={len(trained_steps)}, {args.prompts} prompts, {args.threads} thread(s)"
    )
    print(f"{'mode':<9} {'micro':>5} {'forwards':>9} {'calls':>6} {'seconds':>8}")
    for row in rows:
        print(
            f"{row['mode']:<9} {row['micro_batch']:>5} {row['sampling_forwards']:>9} {row['model_calls']:>6} {row['seconds']:>8.3f}"
        )
    print(f"batched is {result['speedup_batched_vs_batch1']:.1f}× faster; same final latents: {result['same_result']}")
    print(f"sampling forwards per prompt: this project {ours}, reference code {reference}")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
