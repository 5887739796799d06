"""`g2rpo eval --output`: no file of the user's is written over, and a failed start blocks no rerun."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from g2rpo import cli
from g2rpo.artifacts.scores import EvalScores

pytestmark = pytest.mark.integration

PROMPTS = Path(__file__).resolve().parents[2] / "configs" / "tiny-prompts.txt"


def _argv(model: Path | str, out: Path) -> list[str]:
    return [
        "eval",
        "--model",
        str(model),
        "--prompts",
        str(PROMPTS),
        "--output",
        str(out),
        "--seeds",
        "0",
        "--steps",
        "2",
        "--metrics",
        "jpeg_compressibility",
        "num_prompts=1",
        "device=cpu",
    ]


def _checksums(folder: Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }


def test_a_folder_holding_the_users_files_is_refused_naming_them_and_left_as_it_was(tiny_flux_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("my notes\n")
    (out / "grid.png").write_bytes(b"\x89PNG\r\n\x1a\nnot g2rpo's grid")  # a name the artifact also uses
    before = _checksums(out)

    assert cli.main(_argv(tiny_flux_dir, out)) == 2
    err = capsys.readouterr().err
    assert f"output_uri={str(out)!r}" in err
    assert "not an evaluation's (grid.png, notes.txt)" in err and "new or empty folder" in err
    assert _checksums(out) == before  # the same two files, byte for byte, and nothing beside them


def test_a_failure_before_the_first_sample_leaves_nothing_that_blocks_the_corrected_rerun(
    tiny_flux_dir, tmp_path, capsys
):
    out = tmp_path / "eval"
    assert cli.main(_argv(tmp_path / "no-such-model", out)) == 2  # a wrong model path: nothing sampled
    assert "no-such-model" in capsys.readouterr().err

    assert cli.main(_argv(tiny_flux_dir, out)) == 0  # the corrected rerun, into the same folder
    assert EvalScores.model_validate_json((out / "scores.json").read_text()).seeds == [0]
    assert not (out / "_partial").exists()
