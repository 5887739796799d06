"""The decision report on the real tiny Flux, rendered by headless Chromium: the verdict, every gate
with the challenger's and the baseline's means, the paired Δ and CI, pass/fail and reason, trained
vs held-out, and the same prompts' images side by side — every image loading."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from g2rpo.artifacts.manifest import write_dir_manifest
from g2rpo.artifacts.promotion import decide, load_gates
from g2rpo.config import load_config
from g2rpo.errors import G2RPOError
from g2rpo.evaluation.config import EvaluationConfig
from g2rpo.steps.decision_report import binary_checks, curve_title, reward_curves_png, write_decision_report
from g2rpo.steps.evaluate import evaluate
from g2rpo.steps.records import CandidatesRecord
from tests.tiny_flux_fixture import make_tiny_flux

pytestmark = pytest.mark.integration

METRICS = ["jpeg_compressibility", "sharpness"]

_CHECK = """
<script>
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  const cells = (row) => Array.from(row.querySelectorAll("td")).map((td) => td.textContent.trim());
  const out = document.createElement("pre");
  out.id = "g2rpo-check";
  out.textContent = JSON.stringify({
    verdict: document.getElementById("verdict").textContent,
    gates: Array.from(document.querySelectorAll("#gates tr")).slice(1).map(cells),
    heads: Array.from(document.querySelectorAll("#gates th")).map((th) => th.textContent),
    pairs: document.querySelectorAll("#pairs tr").length - 1,
    images: images.length,
    broken: images.filter((img) => !(img.complete && img.naturalWidth > 0)).length});
  document.body.appendChild(out);
});
</script>
"""


def _config(**extra) -> EvaluationConfig:
    values = {
        "prompts": "builtin:tiny",
        "num_prompts": 2,
        "seeds": [0, 5],
        "num_steps": 3,
        "rewards": {"models": [{"name": name} for name in METRICS]},
        "trained_metrics": ["jpeg_compressibility"],
        "device": "cpu",
        **extra,
    }
    return load_config(EvaluationConfig, None, values)


def _chromium(page: Path, profile: Path, *flags: str) -> subprocess.CompletedProcess:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed: `make install` installs Debian's chromium package")
    argv = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
    argv += ["--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"]
    argv += ["--virtual-time-budget=10000", *flags, page.as_uri()]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def _decided(base, challenger, gates_yaml: str, trained: str, label: str, folder: Path):
    """The gates' decision on ``challenger`` (no champion) and the candidates record pairing it with ``base``."""
    gates_file = folder / "gates.yaml"
    gates_file.write_text(gates_yaml)
    gates, sha = load_gates(gates_file)
    decision = decide(challenger.scores, None, gates, model="m", challenger_version=1, gates_sha256=sha)
    candidates = CandidatesRecord(
        challenger_eval_uri=challenger.output_uri,
        challenger_means=challenger.means,
        baseline_label=label,
        baseline_eval_uri=base.output_uri,
        baseline_means=base.means,
        trained_metrics=[trained],
    )
    return decision, candidates


def _rendered_check(report: Path, script: str, folder: Path) -> dict:
    """What ``script`` (appended to ``report``) wrote into ``<pre id="g2rpo-check">`` in headless Chromium."""
    page = folder / "check.html"
    page.write_text(report.read_text().replace("</body>", script + "</body>"))
    dom = _chromium(page, folder / "profile", "--dump-dom").stdout
    return json.loads(dom.split('<pre id="g2rpo-check">', 1)[1].split("</pre>", 1)[0].replace("&quot;", '"'))


def test_the_decision_report_tells_the_story_and_renders(tiny_flux_dir, tmp_path):
    base = evaluate(str(tiny_flux_dir), _config(), str(tmp_path / "base-model"))
    other = make_tiny_flux(tmp_path / "trained", seed=1234)
    challenger = evaluate(
        str(other), _config(), str(tmp_path / "challenger"), baseline_uri=base.output_uri, baseline_label="base model"
    )
    # The challenger's own report labels its metrics and names its baseline.
    own = (tmp_path / "challenger" / "report.html").read_text()
    assert "<td class='trained'>trained</td>" in own and "<td class='held-out'>held-out</td>" in own
    assert f"base model: {base.output_uri}" in own

    jpeg = challenger.means["jpeg_compressibility"]
    gates_yaml = (
        "metrics:\n"
        f"  jpeg_compressibility: {{direction: higher, domain: in, min_improvement: 0, floor: {jpeg + 1}}}\n"
        "  sharpness: {direction: higher, domain: out, max_regression: 1, floor: -1000}\n"
    )
    decision, candidates = _decided(base, challenger, gates_yaml, "jpeg_compressibility", "base model", tmp_path)
    train_dir = tmp_path / "train"  # the train task's folder: its iteration records
    train_dir.mkdir()
    records = [{"iteration": i, "reward_names": METRICS, "reward_mean": [[0.1 * i, 0.2], [0.5, 0.4]]} for i in range(3)]
    # validation during training writes its events into the same file: not iterations, left out of the curves
    records.insert(1, {"event": "validation", "iteration": 0, "objective": 0.5, "metrics": {}, "breached": []})
    records.append({"event": "early_stop", "iteration": 2, "reason": "held-out metrics beyond tolerance"})
    (train_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    report = write_decision_report(tmp_path / "decision.html", decision, candidates, train_dir=train_dir)

    check = _rendered_check(report, _CHECK, tmp_path)
    assert check["verdict"] == "v1: REFUSED — 1 of 2 gate(s) not met"
    assert check["heads"] == [
        "metric", "role", "gate", "challenger", "base model", "Δ (paired)", "95% CI of Δ", "result", "reason"
    ]  # fmt: skip
    paired = json.loads((tmp_path / "challenger" / "metrics.json").read_text())["baseline"]["paired"]["3"]
    (jpeg_row, sharp_row) = check["gates"]
    assert jpeg_row[:3] == ["jpeg_compressibility", "trained", "floor"] and jpeg_row[7] == "FAIL"
    assert sharp_row[:3] == ["sharpness", "held-out", "floor"] and sharp_row[7] == "pass"
    for row, name in ((jpeg_row, "jpeg_compressibility"), (sharp_row, "sharpness")):
        s = paired[name]
        assert row[3:7] == [
            f"{challenger.means[name]:.4f}",
            f"{base.means[name]:.4f}",
            f"{s['delta']:+.4f}",
            f"[{s['ci_low']:+.4f}, {s['ci_high']:+.4f}]",
        ]
        assert row[8] == next(r.reason for r in decision.results if r.metric == name)
    # the same 2 prompts × 2 seeds, base model | challenger, every image embedded and loading
    # and the reward curves of training
    assert check["pairs"] == 4 and check["images"] == 8 + 1 and check["broken"] == 0
    assert "rollout mean over the 3 iteration(s)" in report.read_text()
    _chromium(report, tmp_path / "profile", "--window-size=1200,1600", f"--screenshot={tmp_path / 'decision.png'}")
    assert (tmp_path / "decision.png").stat().st_size > 10_000  # a page was drawn (look at it: docs/demo.md)


def test_the_training_curves_are_legible_and_say_trained_or_not_trained():
    """Eight rewards (the demo's) in two rows of four: a page shows the strip at about its own size (it was
    one 2080 × 260 row whose labels shrank to ~6 px); the curves are of training prompts, so a weight-0
    reward is "not trained" there, not "held-out"."""
    from PIL import Image

    names = ["hps_v21", "clip", "shapes_colour", "shapes_shape", "shapes_colour_match", "shapes_position",
             "shapes_background", "jpeg_compressibility"]  # fmt: skip
    records = [{"iteration": i, "reward_names": names, "reward_mean": [[0.1 * i]] * len(names)} for i in range(3)]
    width, height = Image.open(io.BytesIO(reward_curves_png(records, {"hps_v21", "clip"}))).size
    assert width <= 1280 and height >= 2 * 250  # two rows, no wider than the report's column
    assert curve_title("hps_v21", {"hps_v21"}) == "hps_v21 (trained)"
    assert curve_title("shapes_colour", {"hps_v21"}) == "shapes_colour (not trained)"


def test_binary_checks_are_the_metrics_scored_0_or_1_on_every_item():
    base = {("p0", 0): {"match": 1.0, "colour": 0.3}, ("p1", 0): {"match": 0.0, "colour": 1.0}}
    challenger = {("p0", 0): {"match": 0.0, "colour": 1.0}, ("p1", 0): {"match": 1.0, "colour": 0.0}}
    assert binary_checks(base, challenger) == ["match"]  # colour is 0 or 1 on three items, 0.3 on one
    assert binary_checks(base, {("p0", 0): {"colour": 1.0}}) == []  # unscored on an item: not a check
    assert binary_checks({}, {}) == []


_GLANCE = """
<script>
window.addEventListener("load", () => {
  const grids = Array.from(document.querySelectorAll(".grid"));
  const out = document.createElement("pre");
  out.id = "g2rpo-check";
  out.textContent = JSON.stringify({
    title: document.getElementById("glance").textContent,
    text: document.getElementById("glance").nextElementSibling.textContent,
    grids: grids.map((g) => Array.from(g.querySelectorAll("img")).map((img) =>
      [img.className, img.alt, img.complete && img.naturalWidth > 0]))});
  document.body.appendChild(out);
});
</script>
"""


def test_a_check_scored_0_or_1_is_shown_at_a_glance_on_every_item(tiny_flux_dir, tmp_path):
    from g2rpo.models.shapes import SHIPPED_SHAPES_MODEL

    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "a large red circle at the top left on a black background\n"
        "a small blue square at the center on a white background\n"
        "a large yellow triangle at the bottom right on a gray background\n"
    )
    config = _config(
        prompts=str(prompts),
        num_prompts=None,
        rewards={"models": [{"name": "shapes_colour"}, {"name": "shapes_colour_match"}]},
        trained_metrics=["shapes_colour"],
    )
    base = evaluate(str(SHIPPED_SHAPES_MODEL), config, str(tmp_path / "base-model"))
    challenger = evaluate(
        str(tiny_flux_dir), config, str(tmp_path / "challenger"), baseline_uri=base.output_uri, baseline_label="base"
    )
    gates_yaml = "metrics:\n  shapes_colour: {direction: higher, domain: in, min_improvement: 0, floor: 0}\n"
    decision, candidates = _decided(base, challenger, gates_yaml, "shapes_colour", "base", tmp_path)
    report = write_decision_report(tmp_path / "decision.html", decision, candidates)
    check = _rendered_check(report, _GLANCE, tmp_path)
    assert check["title"] == "At a glance: shapes_colour_match"  # shapes_colour is continuous: no glance
    expected_text = []
    for side, result, grid in zip(("base", "challenger"), (base, challenger), check["grids"], strict=True):
        items = {(i.prompt_id, i.seed): i.scores["shapes_colour_match"] for i in result.scores.items}
        keys = [(f"p{p}", seed) for p in range(3) for seed in (0, 5)]
        # every item in order, framed by its own score, every image loading
        assert grid == [["holds" if items[k] == 1.0 else "fails", f"{side} {k[0]} seed {k[1]}", True] for k in keys]
        held = sum(items.values())
        expected_text.append(f"{side}: {held:.0f} of 6 ({held / 6:.1%})")
    assert "; ".join(expected_text) in check["text"]


def test_a_challenger_evaluation_whose_metrics_lack_a_paired_number_is_named(tiny_flux_dir, tmp_path):
    base = evaluate(str(tiny_flux_dir), _config(num_prompts=1), str(tmp_path / "base-model"))
    challenger = evaluate(
        str(tiny_flux_dir), _config(num_prompts=1), str(tmp_path / "challenger"), baseline_uri=base.output_uri
    )
    # The same evaluation with one paired number left out of its metrics.json, sealed again: an artifact
    # published so (or by another tool), which its manifest cannot tell apart.
    folder = tmp_path / "challenger-copy"
    shutil.copytree(tmp_path / "challenger", folder)
    metrics = json.loads((folder / "metrics.json").read_text())
    del metrics["baseline"]["paired"]["3"]["sharpness"]["delta"]
    (folder / "metrics.json").write_text(json.dumps(metrics))
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").unlink()
    write_dir_manifest(folder, producer=manifest["producer"], metadata=manifest["metadata"])
    gates_yaml = (
        "metrics:\n  jpeg_compressibility: {direction: higher, domain: in, min_improvement: 0, floor: -1000}\n"
        "  sharpness: {direction: higher, domain: out, max_regression: 1, floor: -1000}\n"
    )
    decision, candidates = _decided(base, challenger, gates_yaml, "jpeg_compressibility", "base model", tmp_path)
    write_decision_report(tmp_path / "decision.html", decision, candidates)  # the evaluation as published
    damaged = candidates.model_copy(update={"challenger_eval_uri": str(folder)})
    with pytest.raises(
        G2RPOError,
        match=r"challenger-copy/metrics\.json' is not a valid MetricsDocument \(baseline\.paired\.3\.sharpness\.delta: "
        r"Field required\): the evaluation .*challenger-copy was published with it: evaluate again",
    ):
        write_decision_report(tmp_path / "damaged.html", decision, damaged)  # was a KeyError
    assert not (tmp_path / "damaged.html").exists()
