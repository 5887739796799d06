"""`g2rpo registry ...` through g2rpo.cli.main, against a local folder and against S3."""

from __future__ import annotations

import pytest
from registry_helpers import make_scores, publish_export, register_version

from g2rpo.artifacts.manifest import MARKER_NAME
from g2rpo.artifacts.registry import Registry
from g2rpo.artifacts.storage import open_store
from g2rpo.cli import main

pytestmark = pytest.mark.integration


def _register(reg_uri, root_uri, tmp_path, scores, run, extra=()):
    export = publish_export(root_uri, tmp_path, run)
    path = tmp_path / f"scores-{run}.json"
    path.write_text(scores.model_dump_json())
    return main(
        [
            "registry",
            "register",
            "flux-g2rpo",
            "--registry",
            reg_uri,
            "--export",
            export,
            "--scores",
            str(path),
            "--source-run",
            run,
            "--config-hash",
            "abc",
            "--base-model",
            "black-forest-labs/FLUX.1-dev",
            "--licence",
            "flux-1-dev-non-commercial-license",
            *extra,
        ]
    )


def test_registry_cli_full_cycle(root_uri, tmp_path, capsys):
    reg_uri = f"{root_uri}/registry"
    gates = tmp_path / "gates.yaml"
    gates.write_text(
        "metrics:\n"
        "  hps: {direction: higher, domain: in, min_improvement: 0.01, floor: 0.2}\n"
        "  clip: {direction: higher, domain: out, max_regression: 0.01, floor: 0.25}\n"
    )
    assert _register(reg_uri, root_uri, tmp_path, make_scores({"hps": 0.25, "clip": 0.30}), "r1") == 0
    assert _register(reg_uri, root_uri, tmp_path, make_scores({"hps": 0.24, "clip": 0.35}), "r2", ["--challenger"]) == 0
    out = capsys.readouterr().out
    assert "registered flux-g2rpo v1" in out and "challenger → v2" in out

    common = ["--registry", reg_uri, "--gates", str(gates)]
    assert main(["registry", "promote", "flux-g2rpo", "1", *common]) == 0
    out = capsys.readouterr().out
    assert "vs absolute floors (no champion): all 2 gate(s) met" in out and "champion → v1" in out
    # v2: hps −0.01 < +0.01 → the gate fails, exit status 1, champion unchanged.
    assert main(["registry", "promote", "flux-g2rpo", "challenger", *common]) == 1
    out = capsys.readouterr().out
    assert "flux-g2rpo v2 vs champion v1: 1 of 2 gate(s) not met" in out and "champion unchanged (v1)" in out

    # Each version's last decision: the refused challenger says so wherever it is listed.
    assert main(["registry", "list", "--registry", reg_uri]) == 0
    out = capsys.readouterr().out
    assert "flux-g2rpo  2 version(s)  challenger=v2 (REFUSED vs v1 (1 of 2 gate(s) not met)), champion=v1" in out
    assert main(["registry", "list", "flux-g2rpo", "--registry", reg_uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("v1    champion") and "promoted over floors" in lines[0] and "hps=0.2500" in lines[0]
    assert lines[1].startswith("v2    challenger") and "REFUSED vs v1 (1 of 2 gate(s) not met)" in lines[1]
    # `show` leads with the decision; the record's JSON follows it.
    assert main(["registry", "show", "flux-g2rpo", "v2", "--registry", reg_uri]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "flux-g2rpo v2: REFUSED vs v1 (1 of 2 gate(s) not met)"
    assert out.splitlines()[1] == "flux-g2rpo v2 vs champion v1: 1 of 2 gate(s) not met"
    assert '"source_run": "r2"' in out and out.index("not met") < out.index('"source_run"')

    # Scores may also be read from the store itself (here: put there first).
    local = tmp_path / "s3.json"
    local.write_text(make_scores({"hps": 0.30, "clip": 0.30}).model_dump_json())
    assert main(["storage", "put", str(local), f"{root_uri}/evals/r3.json"]) == 0
    assert (
        main(
            [
                "registry",
                "register",
                "flux-g2rpo",
                "--registry",
                reg_uri,
                "--export",
                publish_export(root_uri, tmp_path, "r3"),
                "--scores",
                f"{root_uri}/evals/r3.json" if root_uri.startswith("s3://") else str(local),
                "--source-run",
                "r3",
                "--config-hash",
                "abc",
                "--base-model",
                "b",
                "--licence",
                "l",
            ]
        )
        == 0
    )
    assert main(["registry", "promote", "flux-g2rpo", "3", *common, "--dry-run"]) == 0
    assert "dry run: nothing recorded" in capsys.readouterr().out
    assert Registry(reg_uri).read_state("flux-g2rpo")[0].aliases["champion"] == 1
    assert main(["registry", "promote", "flux-g2rpo", "3", *common, "--reason", "weekly"]) == 0
    assert main(["registry", "rollback", "flux-g2rpo", "--registry", reg_uri, "--reason", "artifacts"]) == 0
    assert "champion v3 → v1 (rollback" in capsys.readouterr().out.splitlines()[-1]
    assert main(["registry", "history", "flux-g2rpo", "--registry", reg_uri]) == 0
    history = capsys.readouterr().out.splitlines()
    assert [line.split()[2:6] for line in history] == [
        ["set-alias", "challenger", "—", "→"],
        ["promote", "champion", "—", "→"],
        ["promote", "champion", "v1", "→"],
        ["rollback", "champion", "v3", "→"],
    ]


def test_registry_cli_gc_spares_champion(root_uri, tmp_path, capsys):
    reg_uri = f"{root_uri}/registry"
    # The packaged default gates (no --gates) cover hps_v21 and clip, what the pipeline's default run scores.
    scores = make_scores({"hps_v21": 0.25, "clip": 0.3})
    assert _register(reg_uri, root_uri, tmp_path, scores, "r1") == 0
    assert main(["registry", "promote", "flux-g2rpo", "1", "--registry", reg_uri]) == 0
    champion_export = Registry(reg_uri).get_version("flux-g2rpo", 1).export.uri
    # Simulate a damaged champion export that lost its manifest but still has the publish marker:
    # GC must not delete it, because the registry names it.
    store = open_store(champion_export)
    store.delete("manifest.json")
    store.put_bytes(MARKER_NAME, b"{}")
    capsys.readouterr()
    assert main(["storage", "gc", f"{root_uri}/exports", "--older-than", "0s", "--registry", reg_uri]) == 0
    assert f"kept (protected) {store.uri}" in capsys.readouterr().out
    assert store.exists("base_model.json")
    # Without --registry, a registry stored under the scanned root is found and protects too.
    assert main(["storage", "gc", root_uri, "--older-than", "0s"]) == 0
    assert f"kept (protected) {store.uri}" in capsys.readouterr().out
    assert store.exists("base_model.json")
    # Scanning only the exports, with no registry named, the damaged export is fair game.
    assert main(["storage", "gc", f"{root_uri}/exports", "--older-than", "0s"]) == 0
    assert not store.exists("base_model.json")


def test_registry_cli_needs_a_registry(monkeypatch, capsys):
    monkeypatch.delenv("G2RPO_REGISTRY_URI", raising=False)
    assert main(["registry", "list"]) == 2
    assert "--registry URI" in capsys.readouterr().err


def test_registry_cli_refused_register_writes_nothing(root_uri, tmp_path, capsys):
    reg_uri = f"{root_uri}/registry"
    good = tmp_path / "scores.json"
    good.write_text(make_scores({"hps": 0.3}).model_dump_json())
    common = ["--source-run", "r", "--config-hash", "h", "--base-model", "b", "--licence", "l", "--registry", reg_uri]
    # An export that was never published: refused before the scores are stored (a published eval
    # artifact that no version points to would never be garbage-collected).
    assert (
        main(
            [
                "registry",
                "register",
                "flux-g2rpo",
                "--export",
                f"{root_uri}/exports/never",
                "--scores",
                str(good),
                *common,
            ]
        )
        == 2
    )
    assert "has no manifest.json" in capsys.readouterr().err
    assert open_store(reg_uri).list() == []
    # A scores file with a NaN: the message names the item and metric, and nothing is stored.
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text().replace('"hps":0.3', '"hps":NaN', 1))
    assert (
        main(
            [
                "registry",
                "register",
                "flux-g2rpo",
                "--export",
                publish_export(root_uri, tmp_path, "r"),
                "--scores",
                str(bad),
                *common,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"--scores='{bad}': not a valid scores file" in err
    assert "items[0].scores.hps=nan: scores must be finite" in err
    assert open_store(reg_uri).list() == []


def test_registry_cli_unknown_model_and_missing_registry_are_errors(root_uri, tmp_path, capsys):
    # A typo must not read as an empty model or registry: exit 2, and what exists, closest first.
    reg_uri = f"{root_uri}/registry"
    registry = Registry(reg_uri)
    for model in ("sdxl-dpo", "flux-g2rpo"):
        register_version(registry, model, root_uri, tmp_path, make_scores({"hps": 0.25}), run=model)
    capsys.readouterr()
    for argv in (
        ["list", "flux-grpo"],
        ["history", "flux-grpo"],
        ["show", "flux-grpo", "1"],
        ["rollback", "flux-grpo", "--reason", "typo"],
    ):
        assert main(["registry", *argv, "--registry", reg_uri]) == 2, argv
        out, err = capsys.readouterr()
        assert not out, argv
        assert "model='flux-grpo': no such model" in err and "closest first: flux-g2rpo, sdxl-dpo" in err, err
    missing = f"{root_uri}/no/such"
    assert main(["registry", "list", "--registry", missing]) == 2
    err = capsys.readouterr().err
    assert "no registry here (it holds no model versions)" in err and "/no/such" in err
    assert main(["registry", "history", "flux-g2rpo", "--registry", missing]) == 2
    assert "no registry here" in capsys.readouterr().err
    if "://" not in root_uri:  # a local registry's neighbours are named (S3 is not searched)
        assert not (tmp_path / "root" / "no").exists()
        assert main(["registry", "list", "--registry", f"{root_uri}/registri"]) == 2
        assert f"registries next to it, closest first: {reg_uri}" in capsys.readouterr().err
    # the real names still work
    assert main(["registry", "history", "flux-g2rpo", "--registry", reg_uri]) == 0
    assert "flux-g2rpo: no alias changes yet" in capsys.readouterr().out


def test_registry_cli_gate_on_a_metric_the_eval_lacks_records_nothing(root_uri, tmp_path, capsys):
    reg_uri = f"{root_uri}/registry"
    registry = Registry(reg_uri)
    for run, hps in (("r1", 0.25), ("r2", 0.30)):
        register_version(registry, "flux-g2rpo", root_uri, tmp_path, make_scores({"hps": hps, "clip": 0.3}), run=run)
    registry.set_alias("flux-g2rpo", "champion", 1, reason="first")
    gates = tmp_path / "gates.yaml"
    gates.write_text(
        "metrics:\n"
        "  hps: {direction: higher, domain: in, min_improvement: 0.01}\n"
        "  pickscore: {direction: higher, domain: out, max_regression: 0.1}\n"
    )
    store = open_store(reg_uri)
    before = {info.key: store.get_bytes(info.key)[0] for info in store.list()}
    capsys.readouterr()
    assert main(["registry", "promote", "flux-g2rpo", "2", "--registry", reg_uri, "--gates", str(gates)]) == 2
    out, err = capsys.readouterr()
    assert "FAILED" not in out and "gates.metrics=['pickscore']" in err and "it has clip, hps" in err, err
    # no decision record, aliases and history unchanged: every object of the registry as it was
    assert {info.key: store.get_bytes(info.key)[0] for info in store.list()} == before
    assert registry.decisions("flux-g2rpo", 2) == []
