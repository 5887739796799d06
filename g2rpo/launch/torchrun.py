"""torchrun for a TrainJob's node, with an exit status that keeps the trainer's usage/configuration status.

``torchrun`` exits with status 1 whenever a worker fails, whatever the worker's own status: its
``ChildFailedError`` leaves ``main`` as an uncaught exception. A node pod running ``torchrun -m g2rpo train``
therefore exits 1 both when ``g2rpo train`` refuses its configuration or a missing model (status
:data:`~g2rpo.errors.USAGE_EXIT_STATUS` in every rank, every attempt) and when a rank crashed, so the Job's
``podFailurePolicy`` cannot fail the job at once on the first and let the JobSet restart the second.

``python -m g2rpo.launch.torchrun ARGS`` takes torchrun's own arguments (``PET_*`` variables included) and runs
torch's launcher in this process, so its rendezvous and its signal handling (SIGTERM forwarded to the
workers, which checkpoint) are torchrun's. When the first worker to fail exited with the usage status, it
exits with that status; any other failure exits 1 as torchrun does, and an exception (a signal, a rendezvous
that timed out) leaves as it would from torchrun.
"""

from __future__ import annotations

import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from g2rpo.errors import USAGE_EXIT_STATUS

__all__ = ["exit_status", "main"]

OTHER_FAILURE_STATUS = 1  # what torchrun itself exits with when a worker fails


def exit_status(failure: ChildFailedError) -> int:
    """The node's exit status for failed workers: the usage status when the first failure (the root cause,
    by time) exited with it, else torchrun's 1. A rank killed by a signal has a negative exit code: not usage."""
    _, first = failure.get_first_failure()
    return USAGE_EXIT_STATUS if first.exitcode == USAGE_EXIT_STATUS else OTHER_FAILURE_STATUS


def main(argv: list[str] | None = None) -> int:
    try:
        run(parse_args(argv))
    except ChildFailedError as failure:
        print(f"torchrun: {failure}", file=sys.stderr, flush=True)  # torchrun's own report of every failed rank
        status = exit_status(failure)
        if status == USAGE_EXIT_STATUS:
            print(
                f"torchrun: the first rank to fail exited with status {USAGE_EXIT_STATUS} (a usage or configuration "
                "error, named in its log above): exiting with it, so the job fails at once instead of restarting",
                file=sys.stderr,
                flush=True,
            )
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
