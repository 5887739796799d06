"""The reward heads at full size on one GPU (random weights): images/s per head.

Part of the GPU run (``benchmarks/gpu_run.sh``); ``--device cpu --tiny`` checks the code path on
tiny towers (numbers meaningless). Each head is the project's own class
(:class:`~g2rpo.rewards.hps.HPSv21`, :class:`~g2rpo.rewards.clip_score.CLIPScore`,
:class:`~g2rpo.rewards.pickscore.PickScore`) around a model of the published architecture built
directly on the device with random weights (nothing can be downloaded there; speed does not depend
on the weights; the loading code is tested on the CPU with tiny weights in the published layouts):

| head | architecture | input |
| --- | --- | --- |
| ``hps_v21`` | open_clip ``ViT-H-14`` (HPS-v2.1) | 224² |
| ``clip`` | open_clip ``ViT-H-14-378-quickgelu`` (apple/DFN5B-CLIP-ViT-H-14-384's) | 378² |
| ``pickscore`` | transformers ``CLIPModel``, ViT-H/14 vision (1280 × 32) + text (1024 × 24) | 224² |

Images are ``--n`` decoded-looking images at ``--size``² (default 720², the paper's), float in
[0, 1] on the device, scored by ``head.score(images, prompts)`` (preprocessing — resize, crop,
normalise — included) in ``--dtype`` (default bf16), best of ``--repeats`` after one warm-up.
Writes ``benchmarks/results/gpu_rewards.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"

# transformers CLIPModel at PickScore_v1's size (its config.json: laion/CLIP-ViT-H-14-laion2B-s32B-b79K's)
PICKSCORE_CONFIG = dict(
    text_config=dict(hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24),
    vision_config=dict(
        hidden_size=1280, intermediate_size=5120, num_attention_heads=16, num_hidden_layers=32, patch_size=14
    ),
    projection_dim=1024,
)
TINY_PICKSCORE_CONFIG = dict(
    text_config=dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=1),
    vision_config=dict(hidden_size=16, intermediate_size=32, num_attention_heads=2, num_hidden_layers=1, patch_size=8),
    projection_dim=16,
)
CLIP_SETTINGS = {  # CLIP's standard processor (PickScore's preprocessor_config.json)
    "size": {"shortest_edge": 224},
    "crop_size": {"height": 224, "width": 224},
    "interpolation": "bicubic",
    "mean": (0.48145466, 0.4578275, 0.40821073),
    "std": (0.26862954, 0.26130258, 0.27577711),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_rewards",
        description="Full-size reward heads (random weights) on one GPU: images/s per head.",
    )
    parser.add_argument("--tiny", action="store_true", help="tiny towers: checks the code path")
    parser.add_argument("--device", default="cuda", help="cuda (default); cpu only checks the code path")
    parser.add_argument("--n", type=int, default=64, help="images per call (default 64)")
    parser.add_argument("--size", type=int, default=720, help="image side (default 720; tiny 64)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls, best kept (default 3)")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="head dtype")
    parser.add_argument("--heads", default="hps_v21,clip,pickscore", help="comma-separated heads to time")
    parser.add_argument("--output", default=str(RESULTS / "gpu_rewards.json"), help="JSON result path")
    args = parser.parse_args(argv)
    if args.tiny and args.size == 720:
        args.size = 64
    return args


def _open_clip_head(cls, arch: str, args: argparse.Namespace, dtype):
    import open_clip
    import torch

    from g2rpo.rewards.openclip_loading import build_open_clip
    from g2rpo.rewards.tiny import TINY_OPEN_CLIP_CONFIG

    if args.tiny:
        model, preprocess_cfg, tokenizer = build_open_clip("bench", "tiny", {"model_cfg": TINY_OPEN_CLIP_CONFIG})
    else:
        with torch.device(args.device):  # initialised on the device: a 1B-parameter init on the host takes long
            model = open_clip.create_model(arch, pretrained=None, device=args.device)
        tokenizer = open_clip.get_tokenizer(arch)
        preprocess_cfg = dict(model.visual.preprocess_cfg)
    return cls(model, tokenizer, preprocess_cfg, device=args.device, dtype=dtype), arch


def build_head(name: str, args: argparse.Namespace):
    import torch

    dtype = getattr(torch, args.dtype)
    if name == "hps_v21":
        from g2rpo.rewards.hps import HPSv21

        return _open_clip_head(HPSv21, "ViT-H-14", args, dtype)
    if name == "clip":
        from g2rpo.rewards.clip_score import CLIPScore

        return _open_clip_head(CLIPScore, "ViT-H-14-378-quickgelu", args, dtype)
    if name == "pickscore":
        from transformers import CLIPConfig, CLIPModel

        from g2rpo.models.tiny import tiny_clip_tokenizer
        from g2rpo.rewards.pickscore import PickScore

        sizes = TINY_PICKSCORE_CONFIG if args.tiny else PICKSCORE_CONFIG
        config = CLIPConfig(
            text_config=dict(sizes["text_config"], max_position_embeddings=77),
            vision_config=dict(sizes["vision_config"], image_size=224 if not args.tiny else 32),
            projection_dim=sizes["projection_dim"],
        )
        with torch.device(args.device):
            model = CLIPModel(config)
        settings = dict(CLIP_SETTINGS)
        if args.tiny:
            settings.update(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
        # a CLIP BPE tokenizer built offline (token ids differ from PickScore's; the text tower's cost does not)
        head = PickScore(model, tiny_clip_tokenizer(), settings, device=args.device, dtype=dtype)
        return head, "CLIPModel ViT-H/14 (PickScore_v1's size)"
    raise SystemExit(f"--heads: unknown head {name!r}; choose from hps_v21, clip, pickscore")


def _sync(torch, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    import torch

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        raise SystemExit("gpu_rewards needs a CUDA device (none visible); see the module docstring")
    gen = torch.Generator(device=args.device).manual_seed(0)
    images = torch.rand(args.n, 3, args.size, args.size, device=args.device, generator=gen)
    prompts = [f"a photo of a red cube number {i} on a table" for i in range(args.n)]
    heads = {}
    for name in [h.strip() for h in args.heads.split(",") if h.strip()]:
        t0 = time.perf_counter()
        head, arch = build_head(name, args)
        _sync(torch, args.device)
        built = time.perf_counter() - t0
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        head.score(images, prompts)  # warm-up
        times = []
        for _ in range(args.repeats):
            _sync(torch, args.device)
            start = time.perf_counter()
            scores = head.score(images, prompts)
            _sync(torch, args.device)
            times.append(time.perf_counter() - start)
        heads[name] = {
            "architecture": arch,
            "parameters": sum(p.numel() for p in head.model.parameters()),
            "build_seconds": built,
            "seconds": times,
            "images_per_s": args.n / min(times),
            "scores_finite": bool(torch.isfinite(scores).all()),
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
        }
        print(
            f"{name}: {arch}, {heads[name]['parameters'] / 1e6:.0f}M parameters, "
            f"{heads[name]['images_per_s']:.1f} images/s ({args.n} images {args.size}², {args.dtype})",
            flush=True,
        )
        del head
        if cuda:
            torch.cuda.empty_cache()
    result = {
        "benchmark": "gpu_rewards",
        "device": torch.cuda.get_device_name() if cuda else f"{args.device} (code-path check only)",
        "torch": torch.__version__,
        "tiny": args.tiny,
        "images": args.n,
        "image_size": args.size,
        "dtype": args.dtype,
        "heads": heads,
    }
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
