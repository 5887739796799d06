"""Step train on the tiny Flux: the trainer's outputs, the export published as a verified artifact,
and the metrics reader."""

from __future__ import annotations

import pytest
from steps_helpers import PROMPTS, REPO, tiny_run_config

from g2rpo.artifacts.manifest import verify
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from g2rpo.steps.train import train_and_publish
from g2rpo.training.metrics import read_iteration_records
from g2rpo.training.run_config import resume_hash

pytestmark = pytest.mark.integration


def test_train_publishes_the_export_it_wrote(tiny_flux_dir, tmp_path):
    config = tiny_run_config(tiny_flux_dir, tmp_path / "run")
    result = train_and_publish(config, publish_uri=(tmp_path / "store" / "exports").as_uri())
    assert result.summary.iterations == 2 and result.summary.backend == "torch"
    assert result.output_dir == tmp_path / "run" and result.config_hash == resume_hash(config)
    assert result.export_dir == tmp_path / "run" / "export"
    assert [p.name for p in result.checkpoints_dir.iterdir()] == ["iter-000002"]
    # published under a fresh prefix of the base; every byte matches its manifest
    assert result.export_uri.startswith((tmp_path / "store" / "exports").as_uri() + "/model-")
    published = verify(open_store(result.export_uri), deep=True)
    assert published == result.published.manifest and published.config_hash == result.config_hash
    local = {p.relative_to(result.export_dir).as_posix() for p in result.export_dir.rglob("*") if p.is_file()}
    assert {f.path for f in published.files} == local - {"manifest.json"}
    assert published.metadata["iterations"] == 2  # the trainer's export metadata travels with it
    records = read_iteration_records(result.metrics_path)
    assert [r["iteration"] for r in records] == [0, 1]
    assert records[-1]["reward_mean_all"] == pytest.approx(result.summary.last_reward)


def test_train_without_publish_publishes_nothing(tiny_flux_dir, tmp_path):
    result = train_and_publish(tiny_run_config(tiny_flux_dir, tmp_path / "run", train={"iterations": 1}))
    assert result.published is None and result.export_uri is None and result.export_dir.is_dir()


def test_train_refuses_to_publish_without_an_export_before_training(tiny_flux_dir, tmp_path):
    config = tiny_run_config(tiny_flux_dir, tmp_path / "run", output={"export": False})
    with pytest.raises(G2RPOError, match="output.export=False: publishing needs the export"):
        train_and_publish(config, publish_uri=(tmp_path / "store").as_uri())
    assert not (tmp_path / "run").exists() and not (tmp_path / "store").exists()


def test_train_cli_publishes_with_publish(tiny_flux_dir, tmp_path, capsys):
    base = (tmp_path / "store" / "exports").as_uri()
    overrides = [
        f"model.path={tiny_flux_dir}",
        f"data.prompts={PROMPTS}",
        "train.iterations=1",
        "train.progress=false",
        f"output.dir={tmp_path / 'run'}",
    ]
    assert main(["train", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), *overrides, "--publish", base]) == 0
    out = capsys.readouterr().out
    (line,) = [line for line in out.splitlines() if line.startswith("published export → ")]
    uri = line.removeprefix("published export → ")
    assert uri.startswith(base + "/model-")
    assert verify(open_store(uri), deep=True).metadata["iterations"] == 1
