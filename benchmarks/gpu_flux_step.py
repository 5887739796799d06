"""FLUX.1-dev-sized G²RPO on one GPU: sampling throughput, and TFLOP/s and MFU of the training step.

Prepared for a machine with a CUDA device (none was lent while this was written; run it where a
GPU exists). On the CPU only its code path is checked: ``--device cpu --tiny`` runs every phase
below on a two-block transformer of FLUX.1-dev's architecture at 64×64 (a test does; the numbers
of such a run mean nothing). What it does:

1. **Matmul ceiling.** Times a bf16 ``[n, n] @ [n, n]`` GEMM (n = ``--gemm-size``, best of
   ``--repeats``): the achievable dense bf16 TFLOP/s of this device.
2. **Model.** ``FluxTransformer2DModel`` with FLUX.1-dev's configuration (19 double + 38 single
   blocks, 24 heads × 128, joint dim 4096, pooled 768, guidance embedding; 11.9B parameters),
   built on the ``meta`` device (no host memory) and materialised directly on the device in bf16
   (``to_empty`` + seeded normal init). Random weights (no download is possible here): FLOPs,
   memory and speed do not depend on them. ``--lora`` freezes the base and trains peft LoRA
   adapters on the attention projections.
3. **Sampling throughput.** :func:`g2rpo.evaluation.sampling.ode_sample` (the project's ODE
   sampler behind :class:`~g2rpo.models.flux.FluxVelocity`) draws G = ``--group-size`` images of
   one prompt in one batch of G rows over ``--sample-steps`` steps of Flux's grid, at
   ``--size``² (default 720², the paper's: 2025 packed tokens) with 512 text tokens; best of
   ``--sample-repeats`` after a one-call warm-up. Reports images/s, forwards (rows)/s, and from
   the latter the time one paper-settings G²RPO rollout (1892 forwards per prompt) would take.
   The same G images are also sampled one per call (the reference code's way): the ratio of the
   two is what batching buys per forward at this size, and times the forward-count ratio
   2188/1892 it predicts the rollout ratio that ``benchmarks/rollout.py`` measures on the CPU.
4. **The G²RPO training term** (docs/algorithm.md §3, §5): for P groups, **one** forward of the policy at the
   shared state x[k] (P rows, not P·G: the shared-velocity trick), the SDE transition mean, the
   Gaussian log-probability of the G stored branches under it, the clipped surrogate with random
   advantages, and the backward. No optimiser state: full AdamW for 11.9B parameters (fp32 master
   + two moments ≈ 143 GB) does not fit one H200 — that is what ZeRO across 8–16 GPUs is for.

**FLOPs** are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and attention; not
counted analytically), on separate untimed passes, then the timed passes run without it:

- sampling: one forward of one image, times G × steps;
- training, *executed*: the whole forward+backward as it runs (with gradient checkpointing this
  includes the blocks' forward recomputed in the backward);
- training, *model*: executed minus, when checkpointing is on, the transformer blocks' forward
  FLOPs (what the checkpointed blocks recompute; counted per module on the forward pass), so the
  same step with and without checkpointing has the same model FLOPs.

``MFU = model FLOPs / time / peak`` and ``HFU`` the same with executed FLOPs, against the
datasheet's dense bf16 peak and against the measured GEMM ceiling. Peaks (dense = the datasheet's
"with sparsity" figure halved): **H200 SXM 989.5 TFLOP/s** (NVIDIA H200 Tensor Core GPU datasheet,
https://www.nvidia.com/en-us/data-center/h200/: "BFLOAT16 Tensor Core 1,979 TFLOPS", footnoted
"with sparsity"), H200 NVL 835.5 (1,671 with sparsity, same datasheet), H100 SXM 989.5 (H100
datasheet, 1,979 with sparsity), A100 312 (A100 datasheet, dense).

Defaults: P = 1 group of G = 12, 16 sampling steps, gradient checkpointing on; sized to finish
in well under 8 minutes on one H200 (model init well under a minute; 4 × 192 image forwards of
37 TFLOP each — 2 repeats, batched and one per call; a few training steps of about a second). Writes
``benchmarks/results/gpu_flux_step.json``.

Usage: ``python -m benchmarks.gpu_flux_step [--size 720] [--text-tokens 512] [--groups 1]
[--group-size 12] [--steps 3] [--sample-steps 16] [--sample-repeats 2] [--lora]
[--no-checkpointing] [--layers 19 --single-layers 38]``; ``--device cpu --tiny`` for the
code-path check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

FLUX_DEV = dict(
    patch_size=1,
    in_channels=64,
    num_layers=19,
    num_single_layers=38,
    attention_head_dim=128,
    num_attention_heads=24,
    joint_attention_dim=4096,
    pooled_projection_dim=768,
    guidance_embeds=True,
    axes_dims_rope=(16, 56, 56),
)
# --tiny: the same architecture and code path at a size a CPU runs in seconds.
TINY = dict(
    FLUX_DEV,
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=32,
    axes_dims_rope=(4, 6, 6),
)
SIZES = {  # defaults of the size flags: full (FLUX.1-dev at the paper's 720²) and --tiny
    "full": dict(size=720, text_tokens=512, gemm_size=8192, repeats=10, steps=3, sample_steps=16, sample_repeats=2),
    "tiny": dict(size=64, text_tokens=16, gemm_size=128, repeats=1, steps=1, sample_steps=2, sample_repeats=1),
}
CHECKPOINTED_BLOCK = re.compile(r"\.(single_)?transformer_blocks\.\d+$")  # FlopCounterMode's module names
PAPER_ROLLOUT_FORWARDS = 1892  # sampling forwards per prompt at T=16, G=12, |M|=8, Λ={1,2,3}
REFERENCE_ROLLOUT_FORWARDS = 2188  # the reference code's loop at the same settings (benchmarks/rollout.py)


def datasheet_bf16_dense_tflops(device_name: str) -> float | None:
    """Dense bf16 peak of the named device from NVIDIA's datasheets (see the module docstring)."""
    if "H200" in device_name:
        return 835.5 if "NVL" in device_name else 989.5
    if "H100" in device_name and "PCIe" not in device_name and "NVL" not in device_name:
        return 989.5
    if "A100" in device_name:
        return 312.0
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_flux_step",
        description="FLUX.1-dev-sized transformer (bf16, one GPU, random weights): sampling images/s and the "
        "G²RPO training term's TFLOP/s and MFU against the datasheet peak and a measured bf16 matmul ceiling.",
    )
    parser.add_argument("--tiny", action="store_true", help="a two-block model at 64×64: checks the code path")
    parser.add_argument("--size", type=int, help="image side in pixels (multiple of 16; default 720, tiny 64)")
    parser.add_argument("--text-tokens", type=int, help="T5 tokens (FLUX.1-dev 512; tiny 16)")
    parser.add_argument(
        "--groups", type=int, default=1, help="P, groups (prompts) in the term: rows of the one forward"
    )
    parser.add_argument("--group-size", type=int, default=12, help="G: branches the term scores, images sampled")
    parser.add_argument("--steps", type=int, help="timed training steps (after one counted warm-up; default 3)")
    parser.add_argument("--sample-steps", type=int, help="ODE steps per sample (default 16, the paper's T)")
    parser.add_argument("--sample-repeats", type=int, help="timed sampling runs, best taken (default 2)")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (rank --lora-rank) on a frozen base")
    parser.add_argument("--lora-rank", type=int, default=64, help="LoRA rank")
    parser.add_argument("--no-checkpointing", action="store_true", help="keep all activations (more memory)")
    parser.add_argument("--layers", type=int, help="double-stream blocks (FLUX.1-dev 19)")
    parser.add_argument("--single-layers", type=int, help="single-stream blocks (FLUX.1-dev 38)")
    parser.add_argument("--gemm-size", type=int, help="n of the n×n×n bf16 GEMM ceiling (default 8192)")
    parser.add_argument("--repeats", type=int, help="GEMM timing repeats (default 10)")
    parser.add_argument("--output", default=str(RESULTS / "gpu_flux_step.json"), help="JSON result path")
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only checks the code path (tests)")
    parser.add_argument(
        "--sdpa",
        default=os.environ.get("G2RPO_BENCH_SDPA"),
        help="attention backends to allow, comma-separated (flash, efficient, cudnn, math), or default (torch's "
        "choice); unset ($G2RPO_BENCH_SDPA too): the trainer's, cuDNN's kernel off (benchmarks/gpu_diag.py)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="also run one training step under torch.profiler and write its top operators (device time) to FILE",
    )
    args = parser.parse_args(argv)
    for key, value in SIZES["tiny" if args.tiny else "full"].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_ceiling(torch, n: int, repeats: int, device: str = "cuda") -> float:
    """Best measured dense bf16 TFLOP/s of an n×n×n GEMM."""
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    _sync(torch, device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _sync(torch, device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e12


def build_transformer(torch, args: argparse.Namespace):
    from diffusers import FluxTransformer2DModel

    config = dict(TINY if args.tiny else FLUX_DEV)
    if args.layers is not None:
        config["num_layers"] = args.layers
    if args.single_layers is not None:
        config["num_single_layers"] = args.single_layers
    with torch.device("meta"):
        model = FluxTransformer2DModel(**config)
    model = model.to(torch.bfloat16).to_empty(device=args.device)  # dtype set on meta: no fp32 copy on the GPU
    gen = torch.Generator(device=args.device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in model.buffers():
            b.zero_()
    if args.lora:
        from peft import LoraConfig  # optional dependency, only for --lora

        model.requires_grad_(False)
        model.add_adapter(
            LoraConfig(r=args.lora_rank, lora_alpha=args.lora_rank, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        )
    return model, config


def g2rpo_term(torch, velocity, inputs: dict):
    """Loss of one trained step k for P groups: one forward at x[k], G branch log-probs."""
    from g2rpo import core

    x, cond, branches, lp_old, adv = inputs["x"], inputs["cond"], inputs["branches"], inputs["lp_old"], inputs["adv"]
    sigma = torch.full((x.shape[0],), 0.9, device=x.device)
    sigma_next = torch.full((x.shape[0],), 0.85, device=x.device)
    v = velocity(x, sigma, cond)  # [P, L, C] — one row per group
    mean, std = core.sde_mean_std(x, v, sigma, sigma_next, eta=0.7)  # [P, L, C], [P, 1, 1]
    lp_new = core.gaussian_log_prob(branches, mean[:, None], std[:, None], "mean", batch_dims=2)  # [P, G]
    loss, _ = core.clipped_surrogate(lp_new, lp_old, adv, clip_range=1e-4)
    return loss


def measure_sampling(torch, velocity, cond, args: argparse.Namespace, peak: float | None, ceiling: float) -> dict:
    """G images of one prompt by the project's ODE sampler in one batch of G rows: images/s."""
    from torch.utils.flop_counter import FlopCounterMode

    from g2rpo import core
    from g2rpo.evaluation.sampling import ode_sample

    device, g, steps = args.device, args.group_size, args.sample_steps
    length, channels = velocity.latent_shape
    sigmas = core.flux_sigmas(steps, length)
    seeds = list(range(g))
    with torch.no_grad():
        counter = FlopCounterMode(display=False)
        with counter:
            velocity(torch.zeros(1, length, channels, device=device), torch.full((1,), 0.5, device=device), cond)
        flops_per_image_forward = counter.get_total_flops()
        rows = cond[torch.zeros(g, dtype=torch.long)]
        velocity(torch.zeros(g, length, channels, device=device), torch.full((g,), 0.5, device=device), rows)
        times = {g: [], 1: []}  # rows per call: the batch of G, and one image per call (the reference's way)
        for _ in range(args.sample_repeats):
            for rows_per_call in times:
                _sync(torch, device)
                start = time.perf_counter()
                ode_sample(velocity, cond, seeds, sigmas, micro_batch=rows_per_call)
                _sync(torch, device)
                times[rows_per_call].append(time.perf_counter() - start)
    best, best_1 = min(times[g]), min(times[1])
    forwards_per_s = g * steps / best
    tflops = flops_per_image_forward * g * steps / best / 1e12
    return {
        "image_size": args.size,
        "image_tokens": length,
        "group_size": g,
        "rows_per_call": g,
        "steps": steps,
        "seconds": times[g],
        "images_per_s": g / best,
        "forwards_per_s": forwards_per_s,
        "flops_per_image_forward": flops_per_image_forward,
        "achieved_tflops": tflops,
        "mfu_vs_datasheet": None if peak is None else tflops / peak,
        "mfu_vs_measured_ceiling": tflops / ceiling,
        # at the measured rows/s (calls of G rows; the rollout's calls hold micro_batch rows)
        "paper_rollout_forwards_per_prompt": PAPER_ROLLOUT_FORWARDS,
        "estimated_paper_rollout_seconds_per_prompt": PAPER_ROLLOUT_FORWARDS / forwards_per_s,
        # the same G images one per call: what batching buys per forward at this size, and with the
        # forward-count ratio the rollout ratio against the reference loop (benchmarks/rollout.py)
        "batch_1_seconds": times[1],
        "batch_1_images_per_s": g / best_1,
        "per_forward_ratio_batch_1_vs_batched": best_1 / best,
        "predicted_ratio_vs_reference_loop": REFERENCE_ROLLOUT_FORWARDS / PAPER_ROLLOUT_FORWARDS * best_1 / best,
    }


def measure_training(torch, velocity, transformer, inputs: dict, args: argparse.Namespace) -> dict:
    """The G²RPO term's forward+backward: executed and model FLOPs (counted), then timed steps."""
    from torch.utils.flop_counter import FlopCounterMode

    device = args.device
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        g2rpo_term(torch, velocity, inputs)
    forward_flops = counter.get_total_flops()
    # what checkpointing recomputes in the backward: each block's forward (the blocks are checkpointed)
    block_flops = sum(
        sum(ops.values()) for name, ops in counter.get_flop_counts().items() if CHECKPOINTED_BLOCK.search(name)
    )
    counter = FlopCounterMode(display=False)
    with counter:
        g2rpo_term(torch, velocity, inputs).backward()  # also the warm-up
    executed = counter.get_total_flops()
    transformer.zero_grad(set_to_none=True)
    recomputed = 0 if args.no_checkpointing else block_flops
    times = []
    for _ in range(args.steps):
        _sync(torch, device)
        start = time.perf_counter()
        g2rpo_term(torch, velocity, inputs).backward()
        _sync(torch, device)
        times.append(time.perf_counter() - start)
        transformer.zero_grad(set_to_none=True)
    return {
        "forward_flops": forward_flops,
        "recomputed_flops": recomputed,
        "executed_flops_per_step": executed,
        "model_flops_per_step": executed - recomputed,
        "step_seconds": times,
    }


def profile_training(torch, velocity, transformer, inputs: dict, args: argparse.Namespace) -> dict:
    """One training step under ``torch.profiler``: the operators' device (or CPU) self time, top 40, and
    the shares of matmuls, attention and the rest — where the step's time goes."""
    from torch.profiler import ProfilerActivity, profile

    cuda = args.device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    _sync(torch, args.device)
    with profile(activities=activities) as prof:
        g2rpo_term(torch, velocity, inputs).backward()
        _sync(torch, args.device)
    transformer.zero_grad(set_to_none=True)
    averages = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    # operators only: each owns the device time of the kernels it launched, which are listed again as rows of
    # their own (summing both would count the device time twice)
    ops = [e for e in averages if e.device_type == torch.autograd.DeviceType.CPU]
    rows = sorted(ops, key=lambda e: getattr(e, key, 0.0), reverse=True)
    total = sum(getattr(e, key, 0.0) for e in ops) or 1.0
    groups = {
        "matmul": ("mm", "addmm", "bmm", "matmul", "linear", "gemm", "cutlass", "nvjet", "sm90"),
        "attention": ("attention", "flash", "sdpa", "fmha", "cudnn"),
    }
    shares = dict.fromkeys([*groups, "other"], 0.0)
    for event in ops:
        name = event.key.lower()
        group = next((g for g, marks in groups.items() if any(m in name for m in marks)), "other")
        shares[group] += getattr(event, key, 0.0) / total
    table = averages.table(sort_by=key, row_limit=40)
    Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
    Path(args.profile).write_text(table + "\n")
    top = [{"op": e.key, "self_us": getattr(e, key, 0.0), "share": getattr(e, key, 0.0) / total} for e in rows[:15]]
    return {"time_basis": key, "total_us": total, "shares": shares, "top": top, "table": args.profile}


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    device = args.device
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_flux_step needs a CUDA device (none visible); see the module docstring")

    from g2rpo.models.flux import FluxConditioning, FluxVelocity, packed_shape

    started = time.perf_counter()
    torch.backends.cuda.matmul.allow_tf32 = True
    from benchmarks.gpu_diag import apply_sdpa_backends

    sdpa = apply_sdpa_backends(torch, args.sdpa, args.device)
    device_name = torch.cuda.get_device_name() if cuda else f"{device} (code-path check only)"
    peak = datasheet_bf16_dense_tflops(device_name)
    ceiling = matmul_ceiling(torch, args.gemm_size, args.repeats, device)
    t0 = time.perf_counter()
    transformer, config = build_transformer(torch, args)
    _sync(torch, device)
    init_seconds = time.perf_counter() - t0
    n_params = sum(p.numel() for p in transformer.parameters())
    n_trainable = sum(p.numel() for p in transformer.parameters() if p.requires_grad)
    # FluxVelocity sets the transformer's checkpointing (off unless asked: it would undo an enable here)
    velocity = FluxVelocity(
        transformer, height=args.size, width=args.size, guidance=3.5, gradient_checkpointing=not args.no_checkpointing
    ).to(device)
    length, channels = packed_shape(args.size, args.size)
    p, g = args.groups, args.group_size
    gen = torch.Generator(device=device).manual_seed(1)
    text_dim, pooled_dim = config["joint_attention_dim"], config["pooled_projection_dim"]

    def conditioning(rows: int) -> FluxConditioning:
        return FluxConditioning(
            torch.randn(rows, args.text_tokens, text_dim, device=device, dtype=torch.bfloat16, generator=gen),
            torch.randn(rows, pooled_dim, device=device, dtype=torch.bfloat16, generator=gen),
        )

    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    sampling = measure_sampling(torch, velocity, conditioning(1), args, peak, ceiling)
    sampling["phase_seconds"] = time.perf_counter() - t0
    if cuda:
        sampling["peak_memory_gib"] = torch.cuda.max_memory_allocated() / 2**30
        torch.cuda.reset_peak_memory_stats()

    inputs = {
        "x": torch.randn(p, length, channels, device=device, generator=gen),
        "cond": conditioning(p),
        "branches": torch.randn(p, g, length, channels, device=device, generator=gen),
        "lp_old": torch.zeros(p, g, device=device),
        "adv": torch.randn(p, g, device=device, generator=gen),
    }
    t0 = time.perf_counter()
    try:
        training = measure_training(torch, velocity, transformer, inputs, args)
    except Exception as exc:  # the sampling results are kept, with the training error, before failing
        partial = {"benchmark": "gpu_flux_step", "device": device_name, "torch": torch.__version__, "sdpa": sdpa}
        partial.update(sampling=sampling, matmul_ceiling_tflops=ceiling, training_error=f"{type(exc).__name__}: {exc}")
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(partial, indent=1) + "\n")
        raise
    training["phase_seconds"] = time.perf_counter() - t0
    if args.profile:
        try:  # the measurements above are kept whatever the profiler does
            training["profile"] = profile_training(torch, velocity, transformer, inputs, args)
        except Exception as exc:  # noqa: BLE001 — reported in the JSON, never hidden
            training["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
    best = min(training["step_seconds"])
    achieved = training["model_flops_per_step"] / best / 1e12
    executed_tflops = training["executed_flops_per_step"] / best / 1e12
    result = {
        "benchmark": "gpu_flux_step",
        "device": device_name,
        "torch": torch.__version__,
        "tiny": args.tiny,
        "sdpa": sdpa,
        "config": {k: list(v) if isinstance(v, tuple) else v for k, v in config.items()},
        "parameters": n_params,
        "trainable_parameters": n_trainable,
        "image_size": args.size,
        "image_tokens": length,
        "text_tokens": args.text_tokens,
        "groups": p,
        "group_size": g,
        "lora": args.lora,
        "gradient_checkpointing": not args.no_checkpointing,
        "init_seconds": init_seconds,
        "flop_counting": "torch.utils.flop_counter.FlopCounterMode",
        "matmul_ceiling_tflops": ceiling,
        "datasheet_bf16_dense_tflops": peak,
        "sampling": sampling,
        "training": training,
        # the training step's headline numbers (model FLOPs: without the checkpoint recompute)
        "flops_per_step": training["model_flops_per_step"],
        "step_seconds": training["step_seconds"],
        "achieved_tflops": achieved,
        "mfu_vs_measured_ceiling": achieved / ceiling,
        "mfu_vs_datasheet": None if peak is None else achieved / peak,
        "hfu_vs_datasheet": None if peak is None else executed_tflops / peak,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        "seconds_total": time.perf_counter() - started,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(
        f"device {device_name}; {n_params / 1e9:.3g}B parameters ({n_trainable / 1e9:.3g}B trainable), "
        f"init {init_seconds:.1f} s; peak {peak} TFLOP/s (datasheet, dense bf16), GEMM ceiling {ceiling:.4g}"
    )
    print(
        f"sampling: {g} images {args.size}² × {args.sample_steps} steps in one batch: "
        f"{sampling['images_per_s']:.4g} images/s, {sampling['forwards_per_s']:.4g} forwards/s, "
        f"{sampling['achieved_tflops']:.4g} TFLOP/s; a paper-settings G²RPO rollout ≈ "
        f"{sampling['estimated_paper_rollout_seconds_per_prompt']:.4g} s per prompt; one image per call "
        f"{sampling['batch_1_images_per_s']:.4g} images/s ({sampling['per_forward_ratio_batch_1_vs_batched']:.3g}× "
        f"per forward → {sampling['predicted_ratio_vs_reference_loop']:.3g}× against the reference loop)"
    )
    print(f"{'training step (G²RPO term)':<32} value")
    for key in (
        "flops_per_step",
        "achieved_tflops",
        "mfu_vs_datasheet",
        "hfu_vs_datasheet",
        "mfu_vs_measured_ceiling",
        "peak_memory_gib",
    ):
        value = result[key]
        print(f"{key:<32} {value:.4g}" if isinstance(value, float) else f"{key:<32} {value}")
    print(
        f"step seconds: {', '.join(f'{t:.3f}' for t in training['step_seconds'])}; "
        f"total {result['seconds_total']:.1f} s; wrote {out}"
    )
    return result


if __name__ == "__main__":
    main()
