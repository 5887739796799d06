"""Code kept as a copy on purpose stays a copy: a definition marked ``# Copied from g2rpo.x.y.Name``
must read exactly as the one it names.

A strategy module reads whole (docs/STYLE: one file per strategy), so a method that another strategy
has word for word is sometimes repeated rather than inherited; the mark says where it comes from,
and this check (after diffusers' ``utils/check_copies.py``) keeps the two from drifting: change the
source and its copies together, or drop the mark where they are meant to differ.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARK = re.compile(r"^\s*# Copied from (?P<target>g2rpo(?:\.\w+)+)\s*$")

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _source(path: Path, node: Definition) -> str:
    """The definition's text, decorators included, dedented."""
    lines = path.read_text(encoding="utf-8").splitlines()
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return textwrap.dedent("\n".join(lines[first - 1 : node.end_lineno]))


def _find(body: list[ast.stmt], qualname: list[str]) -> Definition | None:
    for node in body:
        if isinstance(node, Definition) and node.name == qualname[0]:
            return node if len(qualname) == 1 else _find(node.body, qualname[1:])
    return None


def resolve(root: Path, target: str) -> tuple[Path, Definition]:
    """``g2rpo.pkg.module.Class.method`` → the module's file and the definition in it."""
    parts = target.split(".")
    for split in range(len(parts) - 1, 0, -1):
        path = root.joinpath(*parts[:split]).with_suffix(".py")
        if path.is_file():
            node = _find(ast.parse(path.read_text(encoding="utf-8")).body, parts[split:])
            if node is None:
                raise LookupError(f"{target}: {path.relative_to(root)} defines no {'.'.join(parts[split:])}")
            return path, node
    raise LookupError(f"{target}: no module of it under {root}")


def marked_copies(root: Path) -> list[tuple[Path, int, str, Definition]]:
    """Every ``# Copied from`` mark under ``root/g2rpo``: (file, line, target, the definition it marks)."""
    found = []
    for path in sorted((root / "g2rpo").rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        if "# Copied from" not in text:
            continue
        definitions = [n for n in ast.walk(ast.parse(text)) if isinstance(n, Definition)]
        for number, line in enumerate(text.splitlines(), start=1):
            match = MARK.match(line)
            if match is None:
                continue
            marked = [n for n in definitions if min([n.lineno, *(d.lineno for d in n.decorator_list)]) == number + 1]
            if not marked:
                raise LookupError(f"{path.relative_to(root)}:{number}: the mark must stand right above a def or class")
            found.append((path, number, match["target"], marked[0]))
    return found


def drifted_copies(root: Path) -> list[str]:
    """One line per marked copy whose text differs from its source's."""
    problems = []
    for path, number, target, node in marked_copies(root):
        source_path, source = resolve(root, target)
        if _source(path, node) != _source(source_path, source):
            problems.append(
                f"{path.relative_to(root)}:{number}: {node.name} is marked as a copy of {target} but differs from it: "
                "make them equal again, or remove the mark if they are meant to differ"
            )
    return problems


def test_every_marked_copy_reads_as_its_source():
    assert drifted_copies(ROOT) == []


def test_the_copies_this_repository_keeps_are_found():
    # The strategies' one-line advantage and loss methods (issue 42): if the marks vanished, the check
    # above would pass on nothing.
    targets = {(path.name, target) for path, _, target, _ in marked_copies(ROOT)}
    assert {
        ("diffusionnft.py", "g2rpo.strategies.flowgrpo.FlowGRPO.advantages"),
        ("mixgrpo.py", "g2rpo.strategies.dancegrpo.DanceGRPO.advantages"),
        ("mixgrpo.py", "g2rpo.strategies.dancegrpo.DanceGRPO.loss_terms"),
    } <= targets


def test_a_copy_that_drifted_is_named(tmp_path):
    package = tmp_path / "g2rpo"
    package.mkdir()
    (package / "source.py").write_text("class A:\n    def f(self, x):\n        return x + 1\n")
    (package / "copy.py").write_text(
        "class B:\n    # Copied from g2rpo.source.A.f\n    def f(self, x):\n        return x + 2\n"
    )
    (problem,) = drifted_copies(tmp_path)
    assert problem.startswith("g2rpo/copy.py:2: f is marked as a copy of g2rpo.source.A.f but differs")
    (package / "copy.py").write_text(
        "class B:\n    # Copied from g2rpo.source.A.f\n    def f(self, x):\n        return x + 1\n"
    )
    assert drifted_copies(tmp_path) == []
