"""The rollout memory estimate that `g2rpo validate` checks (issue 9: no size check)."""

from __future__ import annotations

from g2rpo.training.memory import RolloutMemory, memory_problem, rollout_memory


def test_memory_g2rpo_paper_settings_by_hand():
    # Paper: 720×720 → packed latents L = (720/16)² = 2025 tokens × C = 64; one prompt per rank,
    # K = |M| = 8, J = |Λ| = 3, G = 12 → N = 1·8·3·12 = 288 final latents and images.
    est = rollout_memory(
        trajectory=False, prompts=1, trained_steps=8, strides=3, group_size=12, num_steps=16,
        latent_tokens=2025, latent_channels=64, height=720, width=720,
    )  # fmt: skip
    assert est.rows == 288
    assert est.final_latents == 288 * 2025 * 64 * 4 == 149_299_200
    # states: x[k] 1·8 latents + branches 1·8·12 = 96 latents → 104 latents
    assert est.states == 104 * 2025 * 64 * 4 == 53_913_600
    assert est.images == 288 * 3 * 720 * 720 * 4 == 1_791_590_400
    assert est.total == 149_299_200 + 53_913_600 + 1_791_590_400


def test_memory_trajectory_strategies_keep_every_state():
    # DanceGRPO: N = P·G = 2·4 = 8 rows; states = P·G·(T+1) = 2·4·5 = 40 latents of 16·8 elements.
    est = rollout_memory(
        trajectory=True, prompts=2, trained_steps=99, strides=99, group_size=4, num_steps=4,
        latent_tokens=16, latent_channels=8, height=8, width=8,
    )  # fmt: skip
    assert est.rows == 8
    assert est.states == 40 * 16 * 8 * 4
    assert est.final_latents == 8 * 16 * 8 * 4
    assert est.images == 8 * 3 * 8 * 8 * 4


def test_memory_problem_names_the_settings_and_the_numbers():
    est = RolloutMemory(final_latents=3 * 2**30, states=2**30, images=4 * 2**30, rows=1_000_000)
    message = memory_problem(est, (2 * 2**30, "available host memory"), "G=100000000")
    assert message is not None
    assert message.startswith("algorithm=")
    assert "8.0 GiB" in message and "2.0 GiB" in message and "1,000,000 images" in message
    assert "lower algorithm.group_size" in message
    assert memory_problem(est, (9 * 2**30, "x"), "G=1") is None
    assert memory_problem(est, None, "G=1") is None  # unknown free memory: no claim


def test_validate_refuses_a_rollout_that_cannot_fit(tmp_path):
    # The case: group_size=1e8 passed validate and died with a bare MemoryError 15 s later.
    # 720×720 (paper defaults): ≥ 1e8·8·3 final latents → petabytes, beyond any machine.
    from g2rpo.cli import main

    config = tmp_path / "run.yaml"
    config.write_text("{}\n")
    model = tmp_path / "no-model"
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(["validate", "--config", str(config), f"model.path={model}", "algorithm.group_size=100000000"])
    assert code == 2
    text = err.getvalue()
    assert "algorithm='strategy=g2rpo, G=100000000" in text
    assert "one iteration's rollout needs at least" in text and "lower algorithm.group_size" in text


def test_validate_accepts_the_paper_rollout_size_on_this_machine_kind(tmp_path):
    # The paper's settings at one prompt per rank need ~1.9 GiB of rollout: no memory problem here.

    from g2rpo.config import load_config
    from g2rpo.training.preflight import rollout_memory_problem
    from g2rpo.training.run_config import RunConfig

    overrides = [
        "model.path=/nowhere",
        "data.prompts=p.txt",
        "train.prompts_per_iteration=16",
        "deepspeed.enabled=true",
    ]
    cfg = load_config(RunConfig, overrides=overrides)
    assert rollout_memory_problem(cfg.algorithm, cfg.model, cfg.train, world_size=16) is None


def test_out_of_memory_is_recognised_and_explained():
    import torch

    from g2rpo.config import load_config
    from g2rpo.training.memory import is_out_of_memory, out_of_memory_message
    from g2rpo.training.run_config import RunConfig

    # What torch's CPU allocator raises for an impossible allocation (a real one, not a hand-made error).
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as exc:
        real = exc
    assert is_out_of_memory(real)
    assert is_out_of_memory(MemoryError()) and not is_out_of_memory(RuntimeError("shape mismatch"))
    cfg = load_config(RunConfig, overrides=["model.path=/m", "data.prompts=p.txt", "deepspeed.enabled=true"])
    text = out_of_memory_message(cfg, 3, "cpu", real)
    assert text.startswith("out of memory on cpu in iteration 3")
    assert "algorithm.group_size=12" in text and "train.prompts_per_iteration=16" in text
