"""The README is a front door and the docs stand on their own: every relative link resolves inside the
repository (to a file, and to a heading where it names one), nothing points at a file outside it, and
the README stays short.

A link is ``[text](target)`` outside code (fenced blocks and inline code are removed first); web
links (``http(s)://``, ``mailto:``) are not checked here, the tests run offline. A ``#fragment`` must
be a heading of the target page, slugged as GitHub does (lower case, punctuation other than ``-``
and ``_`` dropped, spaces to ``-``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted(
    [README, *(ROOT / "docs").glob("*.md")]
    + [ROOT / folder / "README.md" for folder in ("benchmarks", "charts", "images", "pipelines", "components")]
)
# The front door's budget: a pitch, two commands, the demo's numbers, a file tree, the commands,
# the tests, the headline results and the docs index. Operator material lives in docs/.
README_MAX_BYTES = 16_000

_LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text without fenced blocks or inline code, where a bracket is not a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {github_slug(m) for m in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M)}


def _relative_links(page: Path) -> list[str]:
    targets = [target for _, target in _LINK.findall(_prose(page.read_text(encoding="utf-8")))]
    return [t for t in targets if not re.match(r"^(https?:|mailto:)", t)]


def test_the_slug_follows_github():
    assert github_slug("What `make demo` prints") == "what-make-demo-prints"
    assert github_slug("`algorithm` config (`AlgorithmConfig`)") == "algorithm-config-algorithmconfig"
    assert github_slug("5. The objective") == "5-the-objective"
    assert _LINK.findall(_prose("see [a](b.md) and `[c](d.md)`\n```\n[e](f.md)\n```\n")) == [("a", "b.md")]


def test_every_relative_link_resolves_inside_the_repository():
    broken = []
    for page in PAGES:
        for target in _relative_links(page):
            path_part, _, fragment = target.partition("#")
            resolved = (page.parent / path_part).resolve() if path_part else page
            where = f"{page.relative_to(ROOT)}: ({target})"
            if not resolved.is_relative_to(ROOT):
                broken.append(f"{where} points outside the repository")
            elif not resolved.exists():
                broken.append(f"{where} does not exist")
            elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
                broken.append(f"{where}: no heading #{fragment} in {resolved.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)
    assert sum(len(_relative_links(page)) for page in PAGES) > 50  # the check found the links


def test_the_docs_do_not_depend_on_files_outside_the_repository():
    """A user's clone has no ``../shared``: the algorithm and the architecture are restated in docs/,
    and a page that names the optional tools beside the checkout says what they are (testing.md)."""
    outside = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for needle in ("shared/spec", "ARCHITECTURE.md", "shared/notes"):
            if needle in text:
                outside.append(f"{page.relative_to(ROOT)} names {needle}")
        if "../shared" in text and page.name != "testing.md" and "testing.md" not in text:
            outside.append(f"{page.relative_to(ROOT)} names ../shared without pointing at docs/testing.md")
    assert "../shared" not in README.read_text(encoding="utf-8")
    assert not outside, "\n".join(outside)


def test_the_readme_is_a_front_door():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, (
        f"README.md is {size} bytes, over {README_MAX_BYTES}: move operator material to a docs/ page and link it"
    )
    text = README.read_text(encoding="utf-8")
    linked = {target.partition("#")[0] for target in _relative_links(README)}
    unlisted = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if f"docs/{p.name}" not in linked]
    assert not unlisted, f"docs pages the README's index does not link: {unlisted}"
    assert "make test" in text and "make demo" in text
