"""Every output location is checked before any work starts (issue 9 item 3): an unwritable output of
`g2rpo train`, `data prep`, `model init-tiny`, `eval` or `--summary-json` is a G2RPOError naming the
field, the value and the fix, and nothing is written; a --summary-json folder that does not exist yet
is made.

Read-only folders: the tests run as root, for whom permission bits do not stop a write, so the
read-only case uses a read-only tmpfs mounted over a test folder (skipped where mounting is not
allowed) or, for a regular user, chmod 0o555. The case of a location under a regular file runs
everywhere: it cannot be created by anyone.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from g2rpo.artifacts.storage import check_writable
from g2rpo.cli import main
from g2rpo.errors import G2RPOError
from tests.trainer.trainer_testlib import PROMPTS, REPO, as_cli, tiny_overrides


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder no one can write into (a read-only mount as root; permission bits otherwise)."""
    target = tmp_path / "read-only"
    target.mkdir()
    if os.geteuid() != 0:
        target.chmod(0o555)
        yield target
        target.chmod(0o755)
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(target)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("root without the right to mount a read-only tmpfs: chmod cannot make a folder read-only for root")
    yield target
    subprocess.run(["umount", str(target)], check=True)


def test_check_writable_refuses_what_cannot_be_written(tmp_path, read_only_dir):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(G2RPOError, match=r"output\.dir=.*cannot be created: .*a-file is a file"):
        check_writable(a_file / "run", "output.dir")
    with pytest.raises(G2RPOError, match=r"output=.*is a file, not a folder"):
        check_writable(a_file, "output")
    with pytest.raises(G2RPOError, match=r"--summary-json=.*is a folder"):
        check_writable(tmp_path, "--summary-json", kind="file")
    with pytest.raises(G2RPOError, match=r"output\.dir=.*is not writable \(read-only\)"):
        check_writable(read_only_dir, "output.dir")
    with pytest.raises(G2RPOError, match=r"cannot be created: .*read-only is not writable"):
        check_writable(read_only_dir / "new" / "deeper", "output.dir")
    check_writable(tmp_path / "new" / "deeper", "output.dir")  # made later, with its parents
    check_writable(f"file://{tmp_path}/x.json", "--summary-json", kind="file")
    check_writable("s3://bucket/prefix", "output_uri")  # the store checks S3 when it opens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "read-only"]  # checking wrote nothing


@pytest.mark.parametrize("where", ["read-only", "under-a-file"])
def test_cli_outputs_that_cannot_be_written_are_refused_up_front(tmp_path, read_only_dir, tiny_flux_dir, where, capsys):
    if where == "read-only":
        base = read_only_dir
    else:
        base = tmp_path / "a-file"
        base.write_text("x")
    before = sorted(p.name for p in tmp_path.iterdir())
    train = tiny_overrides(tiny_flux_dir, base / "run")
    commands = [
        ("output.dir=", ["train", "--config", str(REPO / "configs" / "tiny-cpu.yaml"), *as_cli(train)]),
        ("output=", ["data", "prep", "--prompts", str(PROMPTS), "--output", str(base / "data"), "--test-size", "2"]),
        ("output=", ["model", "init-tiny", "--output", str(base / "model")]),
        (
            "output_uri=",
            ["eval", "--model", str(tiny_flux_dir), "--prompts", str(PROMPTS), "--output", str(base / "eval")],
        ),
    ]
    for field, argv in commands:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and field in err and str(base) in err and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_summary_json_is_checked_before_the_run_and_its_folder_made_after(tmp_path, tiny_flux_dir, capsys):
    config = REPO / "configs" / "tiny-cpu.yaml"
    overrides = tiny_overrides(tiny_flux_dir, tmp_path / "run", **{"train.iterations": 1, "output.export": False})
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    argv = ["train", "--config", str(config), *as_cli(overrides)]
    assert main([*argv, "--summary-json", str(a_file / "summary.json")]) == 2
    assert "--summary-json=" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # refused before any training
    summary = tmp_path / "reports" / "today" / "summary.json"  # a folder that does not exist yet
    assert main([*argv, "--summary-json", str(summary)]) == 0
    assert json.loads(summary.read_text())["iterations"] == 1
