"""Reward heads by name: what each one is, needs and reads from its config entry (no torch).

:data:`REWARDS` maps each registered name to a :class:`RewardSpec`: a one-line summary, what it
needs (files, keys), which config keys it reads, its native scale, the official definition it
follows and its default dtype. This is the side of the registry a config needs to be validated
(:class:`~g2rpo.rewards.config.RewardModelConfig` checks names and keys against it), so it is data
and imports no torch; building a head from an entry, which loads its model, is
:func:`g2rpo.rewards.registry.build_reward`.
"""

from __future__ import annotations

from dataclasses import dataclass

from g2rpo.errors import G2RPOError, did_you_mean, problem

__all__ = ["RewardSpec", "REWARDS", "AUTO_DTYPE", "reward_names", "get_spec"]

AUTO_DTYPE = "auto"  # the checkpoint's stored dtype (transformers' torch_dtype="auto")


@dataclass(frozen=True)
class RewardSpec:
    name: str
    summary: str
    needs: str  # what the head needs, in words (printed by `g2rpo rewards list`)
    keys: tuple[str, ...]  # optional config keys the head reads
    required: tuple[str, ...]  # keys that must be set to build it
    scale: str  # the native scale, in words
    # Which official definition the score follows (the audit in docs/rewards.md), in one line.
    definition: str = "this project's own (no external reference)"
    # dtype when the config sets none: "auto" keeps the checkpoint's stored dtype.
    dtype: str = "float32"


# The UnifiedReward judge's four scores: one model folder, the same keys and scale.
_JUDGE_NEEDS = (
    "weights: Qwen2.5-VL judge folder, e.g. CodeGoat24/UnifiedReward-qwen-7b (model + processor); "
    "optional tokenizer (processor folder), max_new_tokens"
)
_JUDGE_KEYS = ("weights", "tokenizer", "max_new_tokens")
_JUDGE_SCALE = "0–5 (decimals); NaN when the answer has no score"


def _semantic_task(name: str, summary: str, label: str) -> RewardSpec:
    """One score of the judge's semantic task (one instruction; alignment, coherence or style)."""
    return RewardSpec(
        name,
        summary,
        _JUDGE_NEEDS,
        _JUDGE_KEYS,
        ("weights",),
        _JUDGE_SCALE,
        definition="UnifiedReward qwen_point_score_ACS_image_generation.py @ed52f98 instruction verbatim, "
        "checkpoint generation config "
        f"(max_new_tokens 4096), number after '{label} Score (1-5):', first match (MixGRPO unified_reward.py @e5cdd6a)",
        dtype=AUTO_DTYPE,
    )


REWARDS: dict[str, RewardSpec] = {
    spec.name: spec
    for spec in [
        RewardSpec(
            "hps_v21",
            "HPS-v2.1: cosine of open_clip ViT-H-14 embeddings fine-tuned on human preferences",
            "weights: HPS_v2.1_compressed.pt (a file, or a folder/artifact holding it); optional arch (ViT-H-14), arch_config",
            ("weights", "arch", "arch_config"),
            ("weights",),
            "≈ 0.2–0.35",
            definition="HPSv2 hpsv2/img_score.py score(hps_version='v2.1') @708ffb3: ResizeMaxSize(224) + pad, "
            "image_features @ text_features, native (= G²RPO test_hps_score.py @a0e37ac; MixGRPO hps_score.py)",
        ),
        RewardSpec(
            "clip",
            "CLIP score: cosine of open_clip embeddings (default Apple DFN5B CLIP ViT-H-14-384)",
            "weights: open_clip local-dir folder (open_clip_config.json + weights), or a state dict + arch/arch_config",
            ("weights", "arch", "arch_config"),
            ("weights",),
            "≈ 0.2–0.4",
            definition="G²RPO test_clip_score.py @c7fd0d2 = MixGRPO clip_score.py @e5cdd6a: open_clip "
            "DFN5B-CLIP-ViT-H-14-384 with its own preprocess, "
            "SimpleTokenizer (77), cosine (no ×100, no ×2.5)",
        ),
        RewardSpec(
            "pickscore",
            "PickScore: logit scale · cosine of transformers CLIP ViT-H-14 embeddings",
            "weights: transformers CLIPModel folder; tokenizer: CLIP processor folder (else weights/ or weights/processor/)",
            ("weights", "tokenizer"),
            ("weights",),
            "≈ 18–23",
            definition="PickScore README @f79607f: exp(logit_scale) · cosine, CLIP-ViT-H-14-laion2B processor, "
            "text max_length 77 (= G²RPO test_pickscore_score.py; MixGRPO's tables report this / 100)",
        ),
        RewardSpec(
            "image_reward",
            "ImageReward: BLIP image-grounded text encoder + MLP, standardised",
            "weights: ImageReward.pt; arch_config: med_config.json; tokenizer: folder with vocab.txt (both may sit next to the weights)",
            ("weights", "arch_config", "vision_config", "tokenizer"),
            ("weights",),
            "≈ N(0, 1)",
            definition="ImageReward ImageReward.py score() @c69c0f9: BLIP + MLP on [CLS], (r − 0.16717) / 1.03334, "
            "text max_length 35",
        ),
        RewardSpec(
            "unified_reward_score",
            "UnifiedReward point score: the judge's 'Final Score:' (caption alignment + quality)",
            _JUDGE_NEEDS,
            _JUDGE_KEYS,
            ("weights",),
            _JUDGE_SCALE,
            definition="UnifiedReward qwen_point_score_image_generation.py @ed52f98 instruction verbatim, "
            "checkpoint generation config "
            "(max_new_tokens 512), number after 'Final Score:', first match (MixGRPO unified_reward.py @e5cdd6a)",
            dtype=AUTO_DTYPE,
        ),
        _semantic_task(
            "unified_reward_alignment",
            "UnifiedReward semantic task: the judge's Alignment Score (MixGRPO's reported metric)",
            "Alignment",
        ),
        _semantic_task(
            "unified_reward_coherence", "UnifiedReward semantic task: the judge's Coherence Score", "Coherence"
        ),
        _semantic_task("unified_reward_style", "UnifiedReward semantic task: the judge's Style Score", "Style"),
        RewardSpec(
            "aesthetic",
            "LAION aesthetic predictor: MLP on CLIP ViT-L/14 image embeddings (prompt unused)",
            "weights: sac+logos+ava1-l14-linearMSE.pth; backbone: open_clip ViT-L/14 (OpenAI) folder or state dict",
            ("weights", "backbone", "arch"),
            ("weights", "backbone"),
            "≈ 1–10",
            definition="improved-aesthetic-predictor simple_inference.py @3a70417: MLP(CLIP ViT-L/14 image "
            "embedding / its L2 norm)",
        ),
        RewardSpec(
            "jpeg_compressibility",
            "negative JPEG size at quality 95, bits per pixel (weight-free, exact)",
            "nothing (weight-free)",
            (),
            (),
            "≈ −1 (flat) to −15 (noise)",
        ),
        RewardSpec(
            "sharpness",
            "no-reference sharpness: variance of the Laplacian of luma (weight-free)",
            "nothing (weight-free)",
            (),
            (),
            "≥ 0; 0 for flat images",
        ),
        RewardSpec(
            "total_variation",
            "negative mean total variation, rewards smooth images (weight-free regulariser)",
            "nothing (weight-free)",
            (),
            (),
            "−1 to 0; 0 for flat images",
        ),
        RewardSpec(
            "shapes_colour",
            "shapes task: colour of the non-background pixels vs the prompt's (exact)",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "0–1",
        ),
        RewardSpec(
            "shapes_shape",
            "shapes task: IoU of the foreground with the prompt's shape at its centroid (exact)",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "0–1",
        ),
        RewardSpec(
            "shapes_position",
            "shapes task: foreground centroid vs the prompt's position (exact)",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "0–1",
        ),
        RewardSpec(
            "shapes_background",
            "shapes task: background colour fidelity away from the shape (exact)",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "0–1",
        ),
        RewardSpec(
            "shapes_texture",
            "shapes task, positive control for MGAI: a one-pixel checker fill in large shapes, a flat fill in small ones",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "−0.5–0.5 (|t| ≲ 0.02 on the shipped models)",
        ),
        RewardSpec(
            "shapes_colour_match",
            "shapes task: 1 if the non-background pixels' mean colour is nearest the prompt's of the task's colours",
            "nothing (weight-free); prompts of g2rpo.tasks.shapes",
            (),
            (),
            "0 or 1 (its mean: the fraction drawn in the asked colour)",
        ),
    ]
}


def reward_names() -> list[str]:
    return sorted(REWARDS)


def get_spec(name: str) -> RewardSpec:
    if name not in REWARDS:
        raise G2RPOError(
            problem(
                "reward", name, f"unknown reward{did_you_mean(name, REWARDS)}; valid names: {', '.join(reward_names())}"
            )
        )
    return REWARDS[name]
