"""The registry, the rewards config section, building heads from config (local and s3://), batched
scoring with NaN reporting, and the ``g2rpo rewards`` CLI."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import yaml

from g2rpo.config import load_config
from g2rpo.errors import ConfigError, G2RPOError
from g2rpo.rewards.config import RewardModelConfig, RewardsConfig
from g2rpo.rewards.registry import BUILDERS, build_reward
from g2rpo.rewards.scoring import score_rewards
from g2rpo.rewards.specs import REWARDS, reward_names

EXPECTED_NAMES = [
    "aesthetic",
    "clip",
    "hps_v21",
    "image_reward",
    "jpeg_compressibility",
    "pickscore",
    "shapes_background",
    "shapes_colour",
    "shapes_colour_match",
    "shapes_position",
    "shapes_shape",
    "shapes_texture",
    "sharpness",
    "total_variation",
    "unified_reward_alignment",
    "unified_reward_coherence",
    "unified_reward_score",
    "unified_reward_style",
]


def test_registry_names():
    assert reward_names() == EXPECTED_NAMES
    assert all(spec.name == name for name, spec in REWARDS.items())


def test_every_spec_has_a_builder_and_every_builder_a_spec():
    # The specs (what a config may name, no torch) and the builders (what loads a head) are two tables
    # under the same names: a name in one only would validate and then fail to build, or never validate.
    assert sorted(BUILDERS) == reward_names()


def test_unknown_reward_name_lists_the_valid_ones():
    with pytest.raises(
        G2RPOError,
        match=r"unknown reward \(did you mean hps_v21\?\); valid names: aesthetic, clip, hps_v21, image_reward",
    ):
        build_reward("hps_v3")


def test_default_config_is_the_papers_setting():
    cfg = RewardsConfig()
    assert [(m.name, m.weight) for m in cfg.models] == [("hps_v21", 1.0), ("clip", 1.0)]
    assert cfg.batch_size_of(cfg.models[0]) == 16


def test_config_from_yaml_with_overrides(tmp_path):
    path = tmp_path / "rewards.yaml"
    path.write_text(yaml.safe_dump({"models": [{"name": "jpeg_compressibility", "weight": 0.5, "batch_size": 4}]}))
    cfg = load_config(RewardsConfig, path, ["batch_size=8"])
    assert cfg.models[0].weight == 0.5 and cfg.batch_size_of(cfg.models[0]) == 4 and cfg.batch_size == 8


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "hpsv2"}], r"unknown reward \(did you mean hps_v21\?\); valid names: aesthetic, clip"),
        ([{"name": "jpeg_compressibility", "weights": "/x"}], "'jpeg_compressibility' does not use it"),
        ([{"name": "clip", "tokenizer": "/x"}], "'clip' does not use it"),
        ([{"name": "clip"}, {"name": "clip"}], "each reward may appear once"),
        ([{"name": "clip", "weight": 0.0}], "at least one reward needs a non-zero weight"),
        ([{"name": "clip", "weight": float("nan")}], "finite"),
        ([{"name": "clip", "batch_size": 0}], "batch_size"),
        ([{"name": "clip", "wieghts": "/x"}], "unknown key"),
        ([], "at least 1"),
    ],
)
def test_bad_configs_are_reported(models, message):
    with pytest.raises(ConfigError, match=message):
        load_config(RewardsConfig, None, {"models": models})


def test_heads_that_need_weights_say_so_when_built():
    with pytest.raises(G2RPOError, match="hps_v21.weights=None: 'hps_v21' needs weights: HPS_v2.1_compressed.pt"):
        build_reward(RewardModelConfig(name="hps_v21"))
    with pytest.raises(G2RPOError, match="does not exist"):
        build_reward(RewardModelConfig(name="clip", weights="/no/such/folder"))


def test_build_every_head_from_config(tiny_hps, tiny_clip_dir, tiny_pickscore, tiny_image_reward, tiny_aesthetic):
    entries = [
        RewardModelConfig(
            name="hps_v21", weights=str(tiny_hps["checkpoint"]), arch_config=str(tiny_hps["open_clip_config"])
        ),
        RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent)),  # folder: finds both files
        RewardModelConfig(name="clip", weights=str(tiny_clip_dir["dir"])),
        RewardModelConfig(
            name="clip", weights=str(tiny_clip_dir["weights"]), arch_config=str(tiny_clip_dir["open_clip_config"])
        ),
        RewardModelConfig(name="pickscore", weights=str(tiny_pickscore["dir"])),
        RewardModelConfig(
            name="image_reward", weights=str(tiny_image_reward["checkpoint"])
        ),  # med_config etc. beside it
        RewardModelConfig(
            name="aesthetic", weights=str(tiny_aesthetic["mlp"]), backbone=str(tiny_aesthetic["clip_dir"])
        ),
        RewardModelConfig(name="jpeg_compressibility"),
        RewardModelConfig(name="sharpness"),
        RewardModelConfig(name="total_variation"),
        RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent), dtype="bfloat16"),
    ]
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    prompts = ["a cat", "a dog"]
    for entry in entries:
        head = build_reward(entry)
        assert head.name == entry.name
        scores = head.score(images, prompts)
        assert scores.shape == (2,) and scores.dtype == torch.float32 and bool(torch.isfinite(scores).all())
    # each builder loads its own files: the same scores as the head's loader on them directly
    from g2rpo.rewards.clip_score import CLIPScore
    from g2rpo.rewards.hps import HPSv21
    from g2rpo.rewards.image_reward import ImageReward

    direct = {
        "hps_v21": HPSv21.from_checkpoint(tiny_hps["checkpoint"], open_clip_config=tiny_hps["open_clip_config"]),
        "clip": CLIPScore.from_local_dir(tiny_clip_dir["dir"]),
        "image_reward": ImageReward.from_checkpoint(
            tiny_image_reward["checkpoint"],
            med_config=tiny_image_reward["med_config"],
            vision_config=tiny_image_reward["vision_config"],
            tokenizer_dir=tiny_image_reward["tokenizer_dir"],
        ),
    }
    for entry in entries[:6]:
        if entry.name in direct:
            assert torch.equal(build_reward(entry).score(images, prompts), direct[entry.name].score(images, prompts)), (
                entry
            )
    assert not torch.equal(direct["hps_v21"].score(images, prompts), direct["clip"].score(images, prompts))


def test_any_float_dtype_is_accepted_and_scored_like_float32(
    tiny_hps, tiny_clip_dir, tiny_pickscore, tiny_image_reward, tiny_aesthetic
):
    """The interface takes images in any float dtype. Pixels k/256 (k = 0..255) need at most 8
    significant bits, so float16, bfloat16 (8-bit significand) and float64 hold them exactly; every
    head computes in its own dtype from the same values, so the scores must be identical."""
    entries = [
        RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent)),
        RewardModelConfig(name="clip", weights=str(tiny_clip_dir["dir"])),
        RewardModelConfig(name="pickscore", weights=str(tiny_pickscore["dir"])),
        RewardModelConfig(name="image_reward", weights=str(tiny_image_reward["checkpoint"])),
        RewardModelConfig(
            name="aesthetic", weights=str(tiny_aesthetic["mlp"]), backbone=str(tiny_aesthetic["clip_dir"])
        ),
        RewardModelConfig(name="jpeg_compressibility"),
        RewardModelConfig(name="sharpness"),
        RewardModelConfig(name="total_variation"),
    ]
    levels = torch.randint(0, 256, (2, 3, 40, 36), generator=torch.Generator().manual_seed(4))
    images = levels.float() / 256.0  # [2, 3, 40, 36], exact in every float dtype
    prompts = ["a cat", "a dog"]
    for entry in entries:
        head = build_reward(entry)
        reference = head.score(images, prompts)
        for dtype in (torch.float16, torch.bfloat16, torch.float64):
            cast = images.to(dtype)
            assert torch.equal(cast.double(), images.double())  # the premise: no rounding
            scores = head.score(cast, prompts)
            assert scores.dtype == torch.float32
            assert torch.equal(scores, reference), (entry.name, dtype, scores, reference)


def test_bad_device_is_a_clear_error():
    with pytest.raises(G2RPOError, match=r"sharpness.device='gpu': use a torch device string such as cpu, cuda"):
        build_reward("sharpness", device="gpu")
    if not torch.cuda.is_available():
        with pytest.raises(
            G2RPOError, match=r"sharpness.device='cuda': CUDA is not available on this machine: use cpu"
        ):
            build_reward("sharpness", device="cuda")
    assert build_reward("sharpness", device=torch.device("cpu")).score(torch.rand(1, 3, 8, 8), [""]).shape == (1,)


def test_score_rewards_checks_its_inputs_like_score():
    head = build_reward("total_variation")
    images = torch.rand(3, 3, 8, 8, generator=torch.Generator().manual_seed(7))
    for batch_size in (0, -1, 1.5, True, [2, 2]):
        with pytest.raises(G2RPOError, match=r"batch_size=.*(positive whole number|one batch size per reward)"):
            score_rewards([head], images, ["", "", ""], batch_size)
    with pytest.raises(G2RPOError, match=r"total_variation.images=.*pass a tensor \[N, 3, H, W\]"):
        score_rewards([head], images.numpy(), ["", "", ""], 2)
    with pytest.raises(G2RPOError, match="2 prompts for 3 images"):
        score_rewards([head], images, ["", ""], 2)
    with pytest.raises(G2RPOError, match="range"):
        score_rewards([head], images * 255, ["", "", ""], 2)
    with pytest.raises(G2RPOError, match="at least one reward model"):
        score_rewards([], images, ["", "", ""], 2)
    torch.testing.assert_close(
        score_rewards([head], images, ["", "", ""], 2), head.score(images, ["", "", ""])[None], rtol=0, atol=0
    )


def test_image_reward_without_its_config_files_is_an_error(tiny_image_reward, tmp_path):
    shutil.copy(tiny_image_reward["checkpoint"], tmp_path / "ImageReward.pt")
    with pytest.raises(G2RPOError, match="image_reward.arch_config=None: set it to BLIP's med_config.json"):
        build_reward(RewardModelConfig(name="image_reward", weights=str(tmp_path / "ImageReward.pt")))


def test_score_rewards_equals_one_call_per_head_and_reports_nan(tiny_hps, tmp_path, caplog):
    head = build_reward(RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent)))
    jpeg = build_reward("jpeg_compressibility")
    images = torch.rand(5, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    prompts = ["a cat", "a dog", "a car", "a tree", "the sea"]
    # [R, N]: row r is models[r] scored over every image, each head in slices of its own size
    scores = score_rewards([head, jpeg], images, prompts, batch_size=[2, 3])
    assert scores.shape == (2, 5) and scores.dtype == torch.float32 and scores.device.type == "cpu"
    torch.testing.assert_close(scores[0], head.score(images, prompts), rtol=0, atol=1e-6)
    torch.testing.assert_close(scores[1], jpeg.score(images, prompts), rtol=0, atol=0)
    torch.testing.assert_close(score_rewards([jpeg, head], images, prompts, 1), scores.flip(0), rtol=0, atol=1e-6)
    # a list of [3, H, W] images of mixed sizes (image files): consecutive images of one size share a call
    mixed = [images[0], images[1], images[2, :, :16, :24], images[3], images[4]]
    calls = []
    original = jpeg._score
    jpeg._score = lambda batch, texts: calls.append(tuple(batch.shape)) or original(batch, texts)
    got = score_rewards([jpeg], mixed, prompts, 2)[0]
    assert calls == [(2, 3, 32, 32), (1, 3, 16, 24), (2, 3, 32, 32)]
    assert got.tolist() == [float(jpeg.score(image[None], [""])[0]) for image in mixed]
    with pytest.raises(G2RPOError, match=r"jpeg_compressibility.images\[1\]=.*\[3, H, W\]"):
        score_rewards([jpeg], [images[0], images], prompts[:2], 2)
    with pytest.raises(G2RPOError, match="4 prompts for 5 images"):
        score_rewards([jpeg], mixed, prompts[:4], 2)
    # a checkpoint whose image projection holds a NaN makes every score NaN: reported by name and count
    state = torch.load(tiny_hps["checkpoint"], weights_only=True)
    state["state_dict"]["visual.proj"][0, 0] = float("nan")
    torch.save(state, tmp_path / "HPS_v2.1_compressed.pt")
    shutil.copy(tiny_hps["open_clip_config"], tmp_path / "open_clip_config.json")
    broken = build_reward(RewardModelConfig(name="hps_v21", weights=str(tmp_path)))
    with pytest.raises(G2RPOError, match="reward 'hps_v21' returned NaN/inf for 5 of 5 image"):
        score_rewards([broken], images, prompts, batch_size=2, require_finite=True)
    assert bool(torch.isnan(score_rewards([broken], images, prompts, batch_size=2)).all())  # kept by default
    # score() itself keeps the NaN scores (the trainer drops their groups) and logs them by name
    caplog.clear()
    with caplog.at_level("WARNING", logger="g2rpo.rewards"):
        scores = broken.score(images[:3], prompts[:3])
    assert bool(torch.isnan(scores).all())
    assert [r.getMessage() for r in caplog.records] == [
        "reward 'hps_v21' returned NaN/inf for 3 of 3 image(s) (indices [0, 1, 2])"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="g2rpo.rewards"):
        head.score(images[:3], prompts[:3])
    assert caplog.records == []  # finite scores: nothing logged


@pytest.mark.integration
def test_weights_from_s3_artifact(tiny_hps, s3_env, tmp_path):
    """A published artifact on a real S3 server (SeaweedFS on loopback) is fetched, verified and cached."""
    from g2rpo.artifacts.publish import publish_dir

    uri = f"s3://{s3_env.bucket}/rewards/hps_v21"
    publish_dir(tiny_hps["checkpoint"].parent, uri)
    remote = build_reward(RewardModelConfig(name="hps_v21", weights=uri), cache_dir=str(tmp_path / "cache"))
    local = build_reward(RewardModelConfig(name="hps_v21", weights=str(tiny_hps["checkpoint"].parent)))
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    assert torch.equal(remote.score(images, ["a", "b"]), local.score(images, ["a", "b"]))
    assert list((tmp_path / "cache" / "artifacts").iterdir())  # cached by manifest digest


@pytest.mark.integration
def test_auxiliary_files_from_s3_artifacts(tiny_image_reward, s3_env, tmp_path):
    """tokenizer / arch_config / vision_config may be s3:// artifacts too: a folder artifact is the
    tokenizer folder, and a config artifact's file is found by its usual name."""
    from g2rpo.artifacts.publish import publish_dir

    configs = tmp_path / "configs"
    configs.mkdir()
    shutil.copy(tiny_image_reward["med_config"], configs / "med_config.json")
    shutil.copy(tiny_image_reward["vision_config"], configs / "vision_config.json")
    publish_dir(configs, f"s3://{s3_env.bucket}/rewards/ir-configs")
    publish_dir(tiny_image_reward["tokenizer_dir"], f"s3://{s3_env.bucket}/rewards/ir-tokenizer")
    alone = tmp_path / "weights"
    alone.mkdir()
    shutil.copy(tiny_image_reward["checkpoint"], alone / "ImageReward.pt")  # nothing beside it
    remote = build_reward(
        RewardModelConfig(
            name="image_reward",
            weights=str(alone / "ImageReward.pt"),
            arch_config=f"s3://{s3_env.bucket}/rewards/ir-configs",
            vision_config=f"s3://{s3_env.bucket}/rewards/ir-configs",
            tokenizer=f"s3://{s3_env.bucket}/rewards/ir-tokenizer",
        ),
        cache_dir=str(tmp_path / "cache"),
    )
    local = build_reward(RewardModelConfig(name="image_reward", weights=str(tiny_image_reward["checkpoint"])))
    images = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(6))
    assert torch.equal(remote.score(images, ["a cat", "a dog"]), local.score(images, ["a cat", "a dog"]))


# --------------------------------------------------------------------------- CLI


def test_cli_rewards_list(capsys):
    from g2rpo.cli import main

    assert main(["rewards", "list"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED_NAMES:
        assert f"\n{name}  (" in "\n" + out
    assert "needs: weights: HPS_v2.1_compressed.pt" in out
    assert main(["rewards", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == EXPECTED_NAMES


def test_cli_rewards_without_a_subcommand_names_it(capsys):
    from g2rpo.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["rewards"])
    assert exit_info.value.code == 2
    assert "g2rpo rewards: error: the following arguments are required: SUBCOMMAND" in capsys.readouterr().err


def test_cli_rewards_score(tmp_path, capsys, tiny_hps):
    import numpy as np
    from PIL import Image

    from g2rpo.cli import main

    paths = []
    for i, value in enumerate((0, 128)):
        path = tmp_path / f"img{i}.png"
        Image.fromarray(np.full((32, 32, 3), value, dtype=np.uint8)).save(path)
        paths.append(str(path))
    assert main(["rewards", "score", "jpeg_compressibility", *paths, "--prompt", "x", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["scores"]) == set(paths) and all(v < 0 for v in result["scores"].values())
    assert (
        main(
            [
                "rewards",
                "score",
                "hps_v21",
                paths[0],
                "--prompt",
                "a cat",
                "--weights",
                str(tiny_hps["checkpoint"].parent),
            ]
        )
        == 0
    )
    assert paths[0] in capsys.readouterr().out
    assert main(["rewards", "score", "hps_v3", paths[0], "--prompt", "x"]) == 2
    assert "valid names" in capsys.readouterr().err
    assert main(["rewards", "score", "jpeg_compressibility", str(tmp_path / "none.png"), "--prompt", "x"]) == 2
    assert "does not exist" in capsys.readouterr().err
