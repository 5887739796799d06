"""Which AdamW a DeepSpeed run builds (``deepspeed.optimizer``), and the dtype a LoRA run loads its frozen base in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from g2rpo.errors import G2RPOError
from g2rpo.training.deepspeed_config import DeepSpeedSection
from g2rpo.training.distributed import DistContext
from g2rpo.training.drivers import build_optimizer, deepspeed_arch_list, optimizer_kind
from g2rpo.training.loading import load_policy
from g2rpo.training.run_config import load_run_config
from tests.trainer.trainer_testlib import as_cli, tiny_overrides

CPU, CUDA = torch.device("cpu"), torch.device("cuda")


def _config(**train):
    overrides = tiny_overrides(Path("model"), Path("run"))
    overrides["train"].update(train)
    return load_run_config(None, as_cli(overrides))


def test_auto_is_fused_adam_on_cuda_and_torch_adamw_on_the_cpu():
    assert optimizer_kind("auto", CUDA) == "fused_adam"
    assert optimizer_kind("auto", CPU) == "adamw"
    assert optimizer_kind("adamw", CUDA) == "adamw"
    assert optimizer_kind("fused_adam", CUDA) == "fused_adam"


def test_fused_adam_on_the_cpu_is_refused_naming_the_setting():
    with pytest.raises(G2RPOError) as err:
        optimizer_kind("fused_adam", CPU)
    assert "deepspeed.optimizer" in str(err.value) and "fused_adam" in str(err.value) and "adamw" in str(err.value)


def test_a_config_with_an_unknown_optimizer_is_refused():
    with pytest.raises(Exception) as err:
        DeepSpeedSection.model_validate({"optimizer": "sgd"})
    assert "optimizer" in str(err.value) and "fused_adam" in str(err.value)


def test_the_cpu_optimizer_carries_the_run_settings():
    config = _config(learning_rate=3e-4, weight_decay=0.05)
    param = torch.nn.Parameter(torch.zeros(3))
    opt = build_optimizer(config, [param], CPU)
    assert type(opt) is torch.optim.AdamW
    group = opt.param_groups[0]
    assert group["lr"] == 3e-4 and group["weight_decay"] == 0.05


@pytest.mark.parametrize(("precision", "base_dtype"), [("bf16", torch.bfloat16), ("fp32", torch.float32)])
def test_a_lora_run_loads_its_frozen_base_in_the_training_precision(tiny_flux_dir, tmp_path, precision, base_dtype):
    overrides = tiny_overrides(tiny_flux_dir, tmp_path / "run")
    overrides["train"].update(precision=precision, lora={"enabled": True, "rank": 4, "alpha": 4.0})
    overrides["deepspeed"]["enabled"] = True
    config = load_run_config(None, as_cli(overrides))
    policy = load_policy(config, DistContext(0, 1, 0, CPU))
    frozen = {p.dtype for p in policy.transformer.parameters() if not p.requires_grad}
    assert frozen == {base_dtype}
    assert any(p.requires_grad for p in policy.transformer.parameters())  # the adapters (DeepSpeed keeps fp32 masters)


def test_a_full_fine_tune_loads_the_base_in_fp32(tiny_flux_dir, tmp_path):
    overrides = tiny_overrides(tiny_flux_dir, tmp_path / "run")
    overrides["train"]["precision"] = "bf16"
    overrides["deepspeed"]["enabled"] = True
    config = load_run_config(None, as_cli(overrides))
    policy = load_policy(config, DistContext(0, 1, 0, CPU))
    assert {p.dtype for p in policy.transformer.parameters()} == {torch.float32}


def test_deepspeed_arch_lists_are_made_readable_for_its_jit_builder():
    assert deepspeed_arch_list("9.0a") == "9.0"  # the H200 image's value: DeepSpeed 0.19.8 fails on int('0a')
    assert deepspeed_arch_list("8.0;9.0a 10.0a+PTX") == "8.0;9.0;10.0+PTX"
    assert deepspeed_arch_list("9.0;9.0a") == "9.0"
    assert deepspeed_arch_list("9.0") == "9.0" and deepspeed_arch_list(None) is None


def test_a_one_process_group_is_left_at_shutdown(tmp_path):
    store = f"file://{tmp_path / 'store'}"
    torch.distributed.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    DistContext(0, 1, 0, CPU).shutdown()
    assert not torch.distributed.is_initialized()
    DistContext(0, 1, 0, CPU).shutdown()  # nothing to leave: no error
