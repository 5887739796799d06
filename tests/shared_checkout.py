"""``../shared`` beside the checkout: the CRD schemas, the real-engine check tools, data whose licence
keeps it out of the repository.

CI has the folder beside its clone (a worktree one level deeper finds the same one); a newcomer's clone
does not, and every test that reads it skips, naming what is missing, instead of failing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# The first ``shared/`` among the repository's parents; where there is none, where CI would have it.
SHARED = next((d / "shared" for d in REPO.parents if (d / "shared").is_dir()), REPO.parent / "shared")


def shared_path(relative: str) -> Path:
    """``../shared/<relative>``, whether or not it exists."""
    return SHARED / relative


def require_shared(relative: str) -> Path:
    """``../shared/<relative>``; skips the calling test, saying what is missing, where it is not there."""
    path = shared_path(relative)
    if not path.exists():
        pytest.skip(f"../shared/{relative} is not beside this checkout ({path}); CI has it")
    return path
