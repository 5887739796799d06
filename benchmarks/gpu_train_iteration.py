"""One real ``g2rpo train`` iteration at FLUX.1-dev's shapes on one GPU: each phase's seconds.

Part of the GPU run (``benchmarks/gpu_run.sh``); on the CPU only its code path is checked
(``--device cpu --tiny``: the tiny model at 64², numbers meaningless). What it does:

1. **A model folder of FLUX.1-dev's shapes with random weights** (nothing can be downloaded on the
   GPU machine), in diffusers' ``FluxPipeline`` layout, loaded by the trainer through the same
   ``from_pretrained`` calls as the real FLUX.1-dev: the transformer at FLUX.1-dev's configuration
   (19 + 38 blocks, 24 heads × 128, 11.9B parameters; built on ``meta``, materialised on the
   device in bf16, seeded normal init, saved as safetensors shards) and the VAE at FLUX.1-dev's
   configuration (AutoencoderKL, 128/256/512/512 channels, 16 latent channels). The text
   encoders are **not** FLUX.1-dev's (T5-XXL alone is 4.7B parameters and runs once per prompt,
   before training): a one-layer ``CLIPTextModel`` of width 768 and a one-layer
   ``T5EncoderModel`` of width 4096 give conditioning of the right widths (512 × 4096 and 768).
2. **The run config** is ``configs/flux-dev-h200.yaml`` (T = 16, G = 12, Λ = {1, 2, 3}, 720²,
   bf16, gradient checkpointing, DeepSpeed ZeRO-2) with LoRA on (rank 64) and one process, one
   prompt per iteration. Each iteration trains ``--branch-steps`` of the 8 steps of M drawn at
   random (``algorithm.g2rpo.branch_steps_per_iteration``): one step of M costs the same
   whichever it is, and the paper's iteration trains all 8, so the JSON gives the measured
   seconds per trained step and the paper iteration extrapolated from them (labelled so).
   Rewards are the weight-free JPEG compressibility; the full-size reward heads' images/s are
   measured separately (``benchmarks/gpu_rewards.py``).
3. **Set-up and iterations timed**: the trainer's set-up (load, LoRA, DeepSpeed, the optimiser's
   op build), then ``--iterations`` iterations (the first includes CUDA's warm-ups). The trainer's
   own per-phase seconds (sampling, decoding, reward, training; the optimiser step inside
   training reported separately) are read from ``metrics.jsonl``, plus the forward counts and
   the peak device memory.

Writes ``benchmarks/results/gpu_train_iteration.json`` (or ``--output``).

Usage: ``python -m benchmarks.gpu_train_iteration [--workdir DIR] [--branch-steps 1] [--iterations 2]``;
``--device cpu --tiny`` for the code-path check.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
PAPER_BRANCH_STEPS = 8  # |M| at T = 16: the noisiest half


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_train_iteration",
        description="One real g2rpo train iteration at FLUX.1-dev's shapes (random weights, LoRA, DeepSpeed "
        "ZeRO-2 on one rank): set-up and each phase's seconds, forwards and peak memory.",
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny model at 64²: checks the code path")
    parser.add_argument(
        "--small-transformer",
        action="store_true",
        help="with --tiny: write the model folder as the full run does (FLUX.1-dev's VAE, the text encoders of "
        "FLUX.1-dev's widths) around a one-block transformer, and train on it at 64² (checks that path on the CPU)",
    )
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only checks the code path")
    parser.add_argument("--workdir", help="where the model folder and the run go (default: a temporary folder)")
    parser.add_argument("--branch-steps", type=int, default=1, help="steps of M trained per iteration (paper 8)")
    parser.add_argument("--iterations", type=int, default=2, help="iterations timed (the first warms up)")
    parser.add_argument(
        "--optimizer",
        default="auto",
        choices=["auto", "adamw", "fused_adam"],
        help="deepspeed.optimizer (auto: FusedAdam on CUDA)",
    )
    parser.add_argument(
        "--sdpa",
        default=os.environ.get("G2RPO_BENCH_SDPA"),
        help="attention backends to allow, comma-separated, or default (torch's choice); unset ($G2RPO_BENCH_SDPA "
        "too): the trainer's, cuDNN's kernel off",
    )
    parser.add_argument("--output", default=str(RESULTS / "gpu_train_iteration.json"), help="JSON result path")
    return parser.parse_args(argv)


def write_flux_dev_shaped_model(folder: Path, device: str, transformer_config: dict | None = None) -> dict:
    """FLUX.1-dev's transformer (or ``transformer_config``) and VAE (random weights) + one-layer text
    encoders of FLUX.1-dev's widths, saved in diffusers' FluxPipeline layout. Returns what was written
    (parameter counts, seconds, bytes)."""
    import torch
    from diffusers import FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

    from benchmarks.decode import flux_vae
    from benchmarks.gpu_flux_step import FLUX_DEV
    from g2rpo.models.tiny import flux_dev_scheduler, tiny_clip_tokenizer, tiny_t5_tokenizer

    started = time.perf_counter()
    with torch.device("meta"):
        transformer = FluxTransformer2DModel(**(transformer_config or FLUX_DEV))
    transformer = transformer.to(torch.bfloat16).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in transformer.parameters():
            p.normal_(0.0, 0.02, generator=gen)
        for b in transformer.buffers():
            b.zero_()
    tokenizer, tokenizer_2 = tiny_clip_tokenizer(), tiny_t5_tokenizer(model_max_length=512)
    torch.manual_seed(1)
    text_encoder = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=len(tokenizer),
            hidden_size=768,
            intermediate_size=1024,
            num_hidden_layers=1,
            num_attention_heads=12,
            max_position_embeddings=77,
            projection_dim=768,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    text_encoder_2 = T5EncoderModel(
        T5Config(
            vocab_size=len(tokenizer_2),
            d_model=4096,
            d_kv=64,
            d_ff=1024,
            num_layers=1,
            num_heads=8,
            feed_forward_proj="gated-gelu",
            pad_token_id=0,
            eos_token_id=1,
            is_encoder_decoder=False,
            use_cache=False,
        )
    )
    vae = flux_vae()
    scheduler = flux_dev_scheduler()
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        text_encoder_2=text_encoder_2,
        tokenizer_2=tokenizer_2,
        transformer=transformer,
    )
    built = time.perf_counter() - started
    pipe.save_pretrained(folder, safe_serialization=True)
    record = {
        "transformer_parameters": sum(p.numel() for p in transformer.parameters()),
        "vae_parameters": sum(p.numel() for p in vae.parameters()),
        "build_seconds": built,
        "save_seconds": time.perf_counter() - started - built,
        "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
    }
    del pipe, transformer
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return record


def build_fused_adam(torch, device: str) -> dict:
    """Load DeepSpeed's FusedAdam CUDA op (JIT-built on first use, then cached) and take one step:
    seconds, and the error if it fails (the run then trains with torch's AdamW and says so)."""
    start = time.perf_counter()
    try:
        from g2rpo.training.drivers import load_fused_adam

        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
        fused_adam = load_fused_adam()
        param = torch.nn.Parameter(torch.ones(4, device=device))
        opt = fused_adam([param], lr=0.1)
        param.grad = torch.ones_like(param)
        opt.step()
        torch.cuda.synchronize()
        moved = float((1 - param.detach()).mean())  # Adam's first step moves each weight by ≈ lr
        return {"seconds": time.perf_counter() - start, "error": None, "first_step": moved, "arch_list": arch_list}
    except Exception as exc:  # noqa: BLE001 — recorded and reported, never hidden
        import traceback

        return {
            "seconds": time.perf_counter() - start,
            "error": f"{type(exc).__name__}: {str(exc)[:2000]}",
            "arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
            "traceback": traceback.format_exc()[-3000:],
        }


def run_config(args: argparse.Namespace, model: Path, prompts: Path, out: Path):
    from g2rpo.training.run_config import load_run_config

    overrides = [
        f"model.path={model}",
        f"data.prompts={prompts}",
        "data.embeddings=null",
        "rewards.models=[{name: jpeg_compressibility}]",
        f"train.iterations={args.iterations}",
        "train.prompts_per_iteration=1",
        "train.lora.enabled=true",
        "train.checkpoint_every=1000",
        "train.keep_iterations=[]",
        "train.progress=false",
        f"algorithm.g2rpo.branch_steps_per_iteration={args.branch_steps}",
        f"deepspeed.optimizer={args.optimizer}",
        "output.export=false",
        f"output.dir={out}",
    ]
    if args.tiny:
        overrides += [
            *([] if args.small_transformer else ["model.create_tiny=true", "data.max_sequence_length=null"]),
            "model.height=64",
            "model.width=64",
            "algorithm.num_steps=4",
            "algorithm.group_size=4",
            "algorithm.g2rpo.granularities=[1, 2]",
            "train.precision=fp32",
            "train.device=cpu",
            "train.gradient_checkpointing=false",
            "deepspeed.reduce_bucket_size=1000000",
        ]
    else:
        overrides += ["train.device=cuda", "data.max_sequence_length=512"]
    return load_run_config(ROOT / "configs" / "flux-dev-h200.yaml", overrides), overrides


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_train_iteration needs a CUDA device (none visible); see the module docstring")
    from benchmarks.gpu_diag import apply_sdpa_backends
    from g2rpo.training.trainer import Trainer

    sdpa = apply_sdpa_backends(torch, args.sdpa, args.device)

    fused_adam = None
    if cuda and args.optimizer in ("auto", "fused_adam"):
        fused_adam = build_fused_adam(torch, args.device)
        print(f"FusedAdam: {fused_adam}", flush=True)
        if fused_adam["error"] and args.optimizer == "auto":
            args.optimizer = "adamw"  # recorded in the JSON: the run then measures the other phases with torch's AdamW
    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="g2rpo-gpu-train-"))
    work.mkdir(parents=True, exist_ok=True)
    model = work / "model"
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(f"a photo of a red cube number {i} on a table" for i in range(8)) + "\n")
    written = None
    if (args.small_transformer or not args.tiny) and not (model / "model_index.json").exists():
        from benchmarks.gpu_flux_step import FLUX_DEV

        one_block = dict(FLUX_DEV, num_layers=1, num_single_layers=1, num_attention_heads=2, attention_head_dim=16)
        one_block["axes_dims_rope"] = (4, 6, 6)
        written = write_flux_dev_shaped_model(model, args.device, one_block if args.small_transformer else None)
        print(f"model folder: {written['bytes'] / 2**30:.1f} GiB in {written['save_seconds']:.0f} s", flush=True)
    cfg, overrides = run_config(args, model, prompts, work / "run")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    trainer.setup()
    setup_seconds = time.perf_counter() - t0
    setup_peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    optimizer = type(trainer.learner.driver.optimizer).__name__
    inner = getattr(trainer.learner.driver.optimizer, "optimizer", None)  # DeepSpeed's wrapper holds the real one
    print(f"set-up {setup_seconds:.1f} s; optimiser {type(inner).__name__ if inner else optimizer}", flush=True)
    records, walls = [], []
    for _ in range(args.iterations):
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        records.append(trainer.step().as_json())
        if cuda:
            torch.cuda.synchronize()
        walls.append(time.perf_counter() - start)
        print(f"iteration {len(walls)}: {walls[-1]:.1f} s {records[-1]['seconds']}", flush=True)
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    trainer.release_claims()
    trainer.ctx.shutdown()  # DeepSpeed's one-process group (its port) is left, as `g2rpo train` leaves it
    last = records[-1]
    per_step = {phase: last["seconds"][phase] for phase in last["seconds"]}
    trained = args.branch_steps
    # The paper's iteration trains all 8 steps of M. Extrapolated from the last iteration (labelled so, not a
    # measurement): sampling at its measured seconds per forward times the paper's forwards per prompt;
    # decoding and reward per image times the paper's images (G·|Λ| per step of M); the backward per
    # trained step times 8, plus the one optimiser step.
    from benchmarks.gpu_flux_step import PAPER_ROLLOUT_FORWARDS

    paper_images = 12 * 3 * PAPER_BRANCH_STEPS
    optimizer_seconds = last.get("optimizer_seconds") or 0.0
    paper = {
        "sampling": per_step["sampling"] / last["sampling_forwards"] * PAPER_ROLLOUT_FORWARDS,
        "decoding": per_step["decoding"] / last["decoded_images"] * paper_images,
        "reward": per_step["reward"] / last["decoded_images"] * paper_images,
        "training": (per_step["training"] - optimizer_seconds) / trained * PAPER_BRANCH_STEPS + optimizer_seconds,
    }
    result = {
        "benchmark": "gpu_train_iteration",
        "device": torch.cuda.get_device_name() if cuda else f"{args.device} (code-path check only)",
        "torch": torch.__version__,
        "tiny": args.tiny,
        "sdpa": sdpa,
        "overrides": overrides,
        "model_folder": written,
        "transformer_parameters": sum(p.numel() for p in trainer.policy.transformer.parameters()),
        "trainable_parameters": sum(p.numel() for p in trainer.policy.transformer.parameters() if p.requires_grad),
        "optimizer": type(inner).__name__ if inner is not None else optimizer,
        "fused_adam_op": fused_adam,
        "setup_seconds": setup_seconds,
        "setup_peak_memory_gib": setup_peak,
        "iterations": records,
        "iteration_wall_seconds": walls,
        "branch_steps_trained_per_iteration": trained,
        "last_iteration_phase_seconds": per_step,
        "last_iteration_optimizer_seconds": last.get("optimizer_seconds"),
        "paper_iteration_forwards": PAPER_ROLLOUT_FORWARDS,
        "paper_iteration_images": paper_images,
        "paper_iteration_phase_seconds_extrapolated": paper,
        "paper_iteration_seconds_extrapolated": sum(paper.values()),
        "peak_memory_gib": peak,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(
        f"last iteration ({trained} of {PAPER_BRANCH_STEPS} steps of M): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in per_step.items())
        + f"; paper iteration ≈ {result['paper_iteration_seconds_extrapolated']:.1f} s (extrapolated); "
        f"peak {peak if peak is None else f'{peak:.1f} GiB'}",
        flush=True,
    )
    if not math.isfinite(sum(per_step.values())):
        raise SystemExit("a phase time is not finite")
    return result


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main(sys.argv[1:])
