"""The ``g2rpo`` command line.

Each area registers its own subcommands from a light module in :mod:`g2rpo.commands` (argument
definitions only). The handlers import the library where they run: the one deliberate exception to
imports-at-the-top in this code base, so that ``g2rpo --help`` answers in a second instead of loading
torch, diffusers and DeepSpeed. A handler returns an exit code or None. A :class:`~g2rpo.errors.G2RPOError` is printed
without a traceback and exits with status 2 (``USAGE_EXIT_STATUS``); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from types import ModuleType

import g2rpo.commands.data
import g2rpo.commands.demo
import g2rpo.commands.eval
import g2rpo.commands.model
import g2rpo.commands.pipeline
import g2rpo.commands.registry
import g2rpo.commands.rewards
import g2rpo.commands.storage
import g2rpo.commands.train
from g2rpo import __version__
from g2rpo.errors import USAGE_EXIT_STATUS, G2RPOError
from g2rpo.progress import quiet_library_bars_in_logs

# The modules that define ``add_commands(subparsers)``, one per area, in the order `g2rpo --help` lists them.
COMMAND_MODULES: list[ModuleType] = [
    g2rpo.commands.demo,
    g2rpo.commands.train,
    g2rpo.commands.eval,
    g2rpo.commands.model,
    g2rpo.commands.data,
    g2rpo.commands.storage,
    g2rpo.commands.registry,
    g2rpo.commands.rewards,
    g2rpo.commands.pipeline,
]


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Help lines wrapped between words only: a verb such as ``pretrain-shapes`` stays whole."""

    def _split_lines(self, text: str, width: int) -> list[str]:
        return textwrap.wrap(" ".join(text.split()), width, break_on_hyphens=False)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="g2rpo",
        description=(
            "G²RPO preference alignment for flow-matching text-to-image models (Flux.1-dev): "
            "train, evaluate, register and promote checkpoints, and build the Kubeflow pipeline. "
            "Run `g2rpo COMMAND --help` for each command."
        ),
        formatter_class=_Formatter,
    )
    parser.add_argument("--version", action="version", version=f"g2rpo {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.add_commands(sub)
    _name_the_verbs(sub)
    return parser


def _name_the_verbs(commands: argparse._SubParsersAction) -> None:
    """End each command's line of ``g2rpo --help`` with its verbs (``model: … [init-tiny, pretrain-shapes,
    …]``), read off the command's own parser, so that the list cannot fall behind a new verb."""
    for line in commands._choices_actions:
        parser = commands.choices[line.dest]
        verbs = [
            verb
            for action in parser._actions
            if isinstance(action, argparse._SubParsersAction)
            for verb in action.choices
        ]
        if verbs:
            line.help = f"{line.help} [{', '.join(verbs)}]"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 0 if args.command is None else USAGE_EXIT_STATUS
    quiet_library_bars_in_logs()  # before a handler imports transformers
    try:
        code = handler(args)
    except G2RPOError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return USAGE_EXIT_STATUS
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`g2rpo registry list | head`): not an error of ours. Point stdout at
        # devnull so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
