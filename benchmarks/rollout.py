"""G²RPO rollout cost: the project's batched rollout against the reference code's sequential loop.

Two ways to produce the same G²RPO rollout (same model, same draws, same final latents):

- ``project``: :meth:`g2rpo.strategies.g2rpo.G2RPO.rollout` with ``stride_schedule: reference``
  and the default ``micro_batch`` — anchor stopped at the last branch step, the anchor's v[k]
  reused for the SDE step, the first finishing forward shared between strides, rows of all
  branches, steps and strides batched into each model call.
- ``reference``: :func:`reference_rollout`, a sequential loop with the structure of
  ``sample_reference_model`` in ``bcmi/Granular-GRPO`` (``fastvideo/train_g2rpo_hps.py``): one
  image per model call; the anchor ODE runs all T steps to σ = 0; each branch recomputes v at x[k]
  for its SDE step; each stride's schedule ``σ[:k+2] + σ[k+2::λ]`` is run from index k+1 and
  scored by the x₀-prediction at its last point but one; nothing is shared between strides.
  Decoding and reward scoring, which the reference interleaves, are left out of both.

Both draw their noise from :class:`g2rpo.seeding.Draws` with the same keys (``initial-noise`` p,
``branch-noise`` p, k, g), so the final latents agree: the run checks it and records the largest
absolute difference.

Cases (``--cases``): ``tiny`` — the tiny random Flux of :mod:`g2rpo.models.tiny` (2 + 2 blocks,
2 heads × 16) at 64×64 (16 image tokens); ``wide`` — a ``FluxTransformer2DModel`` built from
:data:`WIDE_CONFIG` with seeded random weights (2 double + 4 single blocks, 8 heads × 64, width
512), 64×64; ``tiny-256`` / ``wide-256`` — the same models at 256×256 (256 image tokens). Both
models read the tiny pipeline's text encodings (32 T5 tokens of width 32, pooled width 32).

Timing: ``time.perf_counter`` around whole rollouts, interleaved (project, reference, project, …)
so that drift on a shared machine hits both; per repeat the ratio reference/project; reported as
median and min–max. Before the first repeat each model shape is warmed up with one call at batch 1
and one at ``micro_batch``. ``torch`` runs on ``--threads`` threads.

The ratio splits exactly into two factors: the **forward-count ratio** (reference forwards /
project forwards, :func:`reference_forwards` / :func:`~g2rpo.strategies.g2rpo.sampling_forwards`:
counts, the same at any model size) and the **per-forward time ratio** (seconds per forward of the
reference loop / of the batched rollout: what batching buys on this machine). A **probe** times
single forwards at batch 1 and at ``micro_batch`` for every case, ``wide-256`` included, whose full
rollout takes tens of minutes per repeat on a CPU; the probe's per-forward ratio times the
forward-count ratio predicts the rollout ratio, and the measured cases check that prediction.

Writes ``benchmarks/results/rollout.json`` and ``rollout.png`` (ratio against transformer
parameters) and prints a table.

Usage: ``python -m benchmarks.rollout [--cases tiny,tiny-256,wide] [--repeats N] [--probe-cases ...]
[--steps 16] [--group 12] [--strides 1,2,3] [--threads 1] [--output PATH]``.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers import FluxTransformer2DModel
from torch.utils.flop_counter import FlopCounterMode

from g2rpo import core
from g2rpo.models.flux import FluxConditioning, FluxTextEncoder, FluxVelocity
from g2rpo.models.tiny import build_tiny_flux_pipeline
from g2rpo.seeding import Draws
from g2rpo.strategies._shared import make_grid, model_sigma
from g2rpo.strategies.config import AlgorithmConfig
from g2rpo.strategies.g2rpo import sampling_forwards
from g2rpo.strategies.registry import build_strategy
from g2rpo.strategies.settings import G2RPOSettings

RESULTS = Path(__file__).resolve().parent / "results"

# The "wide" model: FLUX.1-dev's architecture (double- then single-stream blocks, RoPE over three
# axes, guidance embedding) at width 512, ~36M parameters; text widths match the tiny encoders.
WIDE_CONFIG = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=4,
    attention_head_dim=64,
    num_attention_heads=8,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    guidance_embeds=True,
    axes_dims_rope=(16, 24, 24),
)


@dataclass(frozen=True)
class Case:
    model: str  # "tiny" or "wide"
    size: int  # image side in pixels: (size / 16)² packed tokens
    repeats: int  # default interleaved repeats (each: one project and one reference rollout)


CASES = {
    "tiny": Case("tiny", 64, 5),
    "tiny-256": Case("tiny", 256, 3),
    "wide": Case("wide", 64, 2),
    "wide-256": Case("wide", 256, 1),
}
DEFAULT_CASES = "tiny,tiny-256,wide"


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


def reference_rollout(
    model: FluxVelocity, config: AlgorithmConfig, cond: FluxConditioning, draws: Draws
) -> tuple[torch.Tensor, int]:
    """The reference code's sampling loop, one image per model call: ``(final latents, forwards)``.

    Final latents come back in the project's row order ``[P, K, J, G]`` flattened (its loop order
    is prompt → branch → step → stride)."""
    latent_shape = model.latent_shape
    sigmas = make_grid(config, latent_shape[0])  # [T+1]
    t_steps, group, eta = config.num_steps, config.group_size, config.eta
    steps = config.g2rpo.all_branch_steps(t_steps)
    strides = list(config.g2rpo.granularities)
    forwards = 0

    def velocity(x: torch.Tensor, sigma: torch.Tensor, p: int) -> torch.Tensor:
        nonlocal forwards
        forwards += 1
        return model(x, model_sigma(config, sigma.reshape(1)), cond[p]).float()

    finals: dict[tuple[int, int, int, int], torch.Tensor] = {}
    for p in range(len(cond)):
        anchor: list[torch.Tensor] = []
        for g in range(group):
            if g == 0:  # the reference runs the anchor with the first branch of each prompt
                x = draws.normal(latent_shape, "initial-noise", p)[None]  # [1, L, C]
                anchor = [x]
                for i in range(t_steps):
                    x = core.ode_step(x, velocity(x, sigmas[i], p), sigmas[i], sigmas[i + 1])
                    anchor.append(x)
            for k in steps:  # every k < T − 1 (M is the noisiest half): each stride has a forward
                x_k = anchor[k]
                v_k = velocity(x_k, sigmas[k], p)  # recomputed for the SDE step
                mean, std = core.sde_mean_std(
                    x_k, v_k, sigmas[k : k + 1], sigmas[k + 1 : k + 2], eta, sigmas[1], config.sde_noise
                )
                y = mean + std * draws.normal(latent_shape, "branch-noise", p, k, g)[None]
                for j, lam in enumerate(strides):
                    schedule = torch.cat((sigmas[: k + 2], sigmas[k + 2 :: lam]))
                    x = y
                    for i in range(k + 1, len(schedule) - 1):
                        v = velocity(x, schedule[i], p)
                        x0 = x - schedule[i] * v  # x₀-prediction: what the last point scores
                        x = core.ode_step(x, v, schedule[i], schedule[i + 1])
                    finals[p, k, j, g] = x0
    order = sorted(finals)  # (p, k, j, g): the project's row order
    return torch.cat([finals[key] for key in order]), forwards


def build_model(case: Case, pipe) -> FluxVelocity:
    if case.model == "tiny":
        transformer = pipe.transformer
    else:
        torch.manual_seed(0)
        transformer = FluxTransformer2DModel(**WIDE_CONFIG)
    return FluxVelocity(transformer.eval(), height=case.size, width=case.size)


def _ratio_summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


def probe(model: FluxVelocity, cond: FluxConditioning, micro_batch: int, min_seconds: float = 1.0) -> dict:
    """Seconds per forward (per row) at batch 1 and at ``micro_batch``, and FLOPs of one forward."""
    length, channels = model.latent_shape
    out = {}
    for key, batch in (("1", 1), ("micro", micro_batch)):
        x = torch.randn(batch, length, channels, generator=torch.Generator().manual_seed(0))
        sigma = torch.full((batch,), 0.5)
        rows = cond[torch.zeros(batch, dtype=torch.long)]
        with torch.no_grad():
            model(x, sigma, rows)  # warm-up
            calls, start = 0, time.perf_counter()
            while calls < 2 or time.perf_counter() - start < min_seconds:
                model(x, sigma, rows)
                calls += 1
            out[f"seconds_per_forward_batch_{key}"] = (time.perf_counter() - start) / calls / batch
    counter = FlopCounterMode(display=False)
    with counter, torch.no_grad():
        model(torch.zeros(1, length, channels), torch.full((1,), 0.5), cond[0])
    out["flops_per_forward"] = counter.get_total_flops()
    out["per_forward_ratio"] = out["seconds_per_forward_batch_1"] / out["seconds_per_forward_batch_micro"]
    return out


def run_case(name: str, case: Case, repeats: int, args: argparse.Namespace, pipe, cond) -> dict:
    model = build_model(case, pipe)
    strides = [int(s) for s in args.strides.split(",")]
    config = AlgorithmConfig(
        num_steps=args.steps,
        group_size=args.group,
        micro_batch=args.micro_batch,
        g2rpo=G2RPOSettings(granularities=strides, stride_schedule="reference"),
    )
    strategy = build_strategy(config)
    draws = Draws(0, 0, (0,))
    steps = config.g2rpo.all_branch_steps(args.steps)
    expected_project = sampling_forwards(args.steps, args.group, steps, strides, "reference")
    expected_reference = reference_forwards(args.steps, args.group, steps, strides)
    probe_result = probe(model, cond, args.micro_batch, min_seconds=0.3)  # also the warm-up

    times = {"project": [], "reference": []}
    project_calls = project_forwards = reference_calls = 0
    finals = {}
    for _ in range(repeats):
        start = time.perf_counter()
        rollout = strategy.rollout(model, cond, draws, model.latent_shape)
        times["project"].append(time.perf_counter() - start)
        start = time.perf_counter()
        with torch.no_grad():
            final, reference_calls = reference_rollout(model, config, cond, draws)
        times["reference"].append(time.perf_counter() - start)
        project_calls, project_forwards = rollout.nfe.model_calls, rollout.nfe.sampling_forwards
        finals = {"project": rollout.final_latents, "reference": final}
    diff = (finals["project"] - finals["reference"]).abs()
    ratios = [r / p for p, r in zip(times["project"], times["reference"], strict=True)]
    forward_ratio = reference_calls / project_forwards
    median_ratio = statistics.median(ratios)
    per_forward = {
        mode: statistics.median(times[mode]) / forwards
        for mode, forwards in (("project", project_forwards), ("reference", reference_calls))
    }
    return {
        "case": name,
        "model": case.model,
        "image_size": case.size,
        "image_tokens": model.latent_shape[0],
        "parameters": sum(p.numel() for p in model.transformer.parameters()),
        "repeats": repeats,
        "project": {
            "sampling_forwards": project_forwards,
            "model_calls": project_calls,
            "micro_batch": args.micro_batch,
            "seconds": _ratio_summary(times["project"]),
            "seconds_per_forward": per_forward["project"],
        },
        "reference": {
            "sampling_forwards": reference_calls,
            "model_calls": reference_calls,
            "seconds": _ratio_summary(times["reference"]),
            "seconds_per_forward": per_forward["reference"],
        },
        "expected_forwards": {"project": expected_project, "reference": expected_reference},
        "final_latents_equal": bool(torch.equal(finals["project"], finals["reference"])),
        "final_latents_max_abs_diff": float(diff.max()),
        "final_latents_max_abs": float(finals["reference"].abs().max()),
        "ratio": _ratio_summary(ratios),
        "forward_count_ratio": forward_ratio,
        "per_forward_time_ratio": median_ratio / forward_ratio,
        "share_of_log_ratio_from_forwards": math.log(forward_ratio) / math.log(median_ratio)
        if median_ratio > 1
        else None,
        "probe": probe_result,
        "predicted_ratio": forward_ratio * probe_result["per_forward_ratio"],
    }


def plot(result: dict, path: Path) -> bool:
    """Ratio against compute per forward (model size × tokens); False if matplotlib is absent."""
    try:
        import matplotlib  # optional: the JSON and the table do not need it

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import ScalarFormatter
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6.8, 4.4))
    colours = {16: "tab:blue", 256: "tab:orange"}
    for row in result["probes"]:
        c = colours.get(row["image_tokens"], "tab:gray")
        ax.plot(row["flops_per_forward"] / 1e9, row["predicted_ratio"], "o", mfc="none", color=c, markersize=9)
        ax.annotate(
            f"{row['case']} ({row['parameters'] / 1e6:.2g}M)",
            (row["flops_per_forward"] / 1e9, row["predicted_ratio"]),
            textcoords="offset points",
            xytext=(0, -16),
            ha="center",
            fontsize=8,
        )
    for row in result["cases"]:
        c = colours.get(row["image_tokens"], "tab:gray")
        r = row["ratio"]
        gflop = row["probe"]["flops_per_forward"] / 1e9
        yerr = [[r["median"] - r["min"]], [r["max"] - r["median"]]]
        ax.errorbar(gflop, r["median"], yerr=yerr, fmt="o", color=c, capsize=3)
    ax.axhline(result["forward_count_ratio"], color="k", linestyle="--", linewidth=1)
    ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
    label = f"forward-count ratio {result['forward_count_ratio']:.3f}"
    ax.text(0.02, result["forward_count_ratio"] * 1.03, label, fontsize=8, transform=ax.get_yaxis_transform())
    for tokens, c in colours.items():
        ax.plot([], [], "o", color=c, label=f"{tokens} image tokens: measured rollouts (median, min–max)")
        ax.plot([], [], "o", mfc="none", color=c, label=f"{tokens} image tokens: forward-count ratio × probe")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(ScalarFormatter())
    ax.yaxis.set_minor_formatter(ScalarFormatter())
    ax.set_xlabel("GFLOP per forward of one image (FlopCounterMode)")
    ax.set_ylabel("reference-loop time / project rollout time")
    s = result["settings"]
    ax.set_title(
        f"G²RPO rollout on the CPU, T={s['steps']} G={s['group']} Λ={{{s['strides']}}}, one prompt", fontsize=10
    )
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rollout", description=__doc__.split("\n")[0])
    parser.add_argument("--cases", default=DEFAULT_CASES, help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved repeats per case (default per case)")
    parser.add_argument(
        "--probe-cases", default=",".join(CASES), help="cases whose single forwards are timed ('' for none)"
    )
    parser.add_argument("--steps", type=int, default=16, help="T (paper 16)")
    parser.add_argument("--group", type=int, default=12, help="G (paper 12)")
    parser.add_argument("--strides", default="1,2,3", help="Λ, comma-separated (paper 1,2,3)")
    parser.add_argument("--micro-batch", type=int, default=AlgorithmConfig().micro_batch, help="project's rows/call")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(RESULTS / "rollout.json"), help="JSON path (the PNG goes beside it)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    names = [n for n in args.cases.split(",") if n]
    probe_names = [n for n in args.probe_cases.split(",") if n]
    unknown = sorted(set(names + probe_names) - set(CASES))
    if unknown:
        parser.error(f"unknown case(s) {unknown}: choose from {', '.join(CASES)}")

    started = time.perf_counter()
    pipe = build_tiny_flux_pipeline(seed=0)
    cond = FluxTextEncoder.from_pipeline(pipe).encode(["a red circle at the top left on a blue background"])
    strides = [int(s) for s in args.strides.split(",")]
    steps = G2RPOSettings(granularities=strides).all_branch_steps(args.steps)
    ours = sampling_forwards(args.steps, args.group, steps, strides)
    reference = reference_forwards(args.steps, args.group, steps, strides)
    rows = []
    for name in names:
        case = CASES[name]
        rows.append(run_case(name, case, args.repeats or case.repeats, args, pipe, cond))
        print(f"  {name}: ratio {rows[-1]['ratio']['median']:.2f}", flush=True)
    probes = []
    for name in probe_names:
        measured = next((row for row in rows if row["case"] == name), None)
        if measured is not None:
            entry = measured["probe"]
            params, tokens = measured["parameters"], measured["image_tokens"]
        else:
            model = build_model(CASES[name], pipe)
            entry = probe(model, cond, args.micro_batch)
            params, tokens = sum(p.numel() for p in model.transformer.parameters()), model.latent_shape[0]
        probes.append(
            {
                "case": name,
                "parameters": params,
                "image_tokens": tokens,
                **entry,
                "predicted_ratio": entry["per_forward_ratio"] * reference / ours,
            }
        )
    result = {
        "benchmark": "rollout",
        "settings": {
            **{k: v for k, v in vars(args).items() if k != "output"},
            "trained_steps": steps,
            "prompts": 1,
            "stride_schedule": "reference",
            "wide_config": {k: list(v) if isinstance(v, tuple) else v for k, v in WIDE_CONFIG.items()},
        },
        "machine": {"platform": platform.platform(), "torch": torch.__version__, "threads": args.threads},
        "forwards_per_prompt": {"project": ours, "reference": reference},
        "forward_count_ratio": reference / ours,
        "cases": rows,
        "probes": probes,
        "seconds_total": None,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    result["plot"] = str(png.name) if plot(result, png) else None
    result["seconds_total"] = time.perf_counter() - started
    out.write_text(json.dumps(result, indent=2) + "\n")
    print_table(result)
    print(f"wrote {out}" + (f" and {png}" if result["plot"] else " (matplotlib missing: no plot)"))
    return result


def print_table(result: dict) -> None:
    s = result["settings"]
    print(
        f"G²RPO rollout, one prompt, T={s['steps']} G={s['group']} |M|={len(s['trained_steps'])} Λ={s['strides']}, "
        f"project micro_batch {s['micro_batch']}, {s['threads']} thread(s); forwards per prompt: "
        f"project {result['forwards_per_prompt']['project']}, reference {result['forwards_per_prompt']['reference']} "
        f"({result['forward_count_ratio']:.3f}×)"
    )
    print(
        f"{'case':<9} {'params':>7} {'tokens':>6} {'n':>2} {'forwards P/R':>12} {'calls P/R':>10} "
        f"{'s P':>7} {'s R':>7} {'ratio R/P median [min–max]':>27} {'fwd×':>6} {'batch×':>6} {'max|Δ|':>8}"
    )
    for row in result["cases"]:
        p, r, q = row["project"], row["reference"], row["ratio"]
        print(
            f"{row['case']:<9} {row['parameters'] / 1e6:>6.2f}M {row['image_tokens']:>6} {row['repeats']:>2} "
            f"{p['sampling_forwards']:>5}/{r['sampling_forwards']:<6} {p['model_calls']:>4}/{r['model_calls']:<5} "
            f"{p['seconds']['median']:>7.2f} {r['seconds']['median']:>7.2f} "
            f"{q['median']:>13.2f} [{q['min']:.2f}–{q['max']:.2f}] "
            f"{row['forward_count_ratio']:>6.3f} {row['per_forward_time_ratio']:>6.2f} "
            f"{row['final_latents_max_abs_diff']:>8.1e}"
        )
    if result["probes"]:
        print("probe: ms per forward at batch 1 / at micro_batch, per-forward ratio, predicted rollout ratio")
        for row in result["probes"]:
            print(
                f"  {row['case']:<9} {row['flops_per_forward'] / 1e9:>7.2f} GFLOP "
                f"{row['seconds_per_forward_batch_1'] * 1e3:>8.2f} / {row['seconds_per_forward_batch_micro'] * 1e3:<8.2f} "
                f"{row['per_forward_ratio']:>5.2f}× → {row['predicted_ratio']:.2f}×"
            )


if __name__ == "__main__":
    main()
