"""The `floorguard` command line: one module per command group, each a `register` that adds
its parsers and a thin `run` over library functions that return values.

floorguard simulate --scenario marquee [--policy guard] [--learner NAME] [--reps N] …
floorguard verify TRACE.jsonl [--strict-sf] [--allow-open] [--json]
floorguard experiment list | run ID… | run all
floorguard init | screen | serve | calibrate | emulate | load | demo | keys | usage | bench …
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib.metadata import version as package_version
from typing import Any

from rich.console import Console

from floorguard._compiled import running
from floorguard.cli import bench, experiment, http, init, keys, screen, simulate, usage, verify
from floorguard.errors import FloorguardError

__all__ = ["build_parser", "main"]


class _Help(argparse.HelpFormatter):
    """Each option's default after its help, where it has one its help does not say already
    (not a flag's False, not None)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if default is None or isinstance(default, bool) or default is argparse.SUPPRESS:
            return text
        if "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Parser(argparse.ArgumentParser):
    """Every command's parser (subparsers are made of their parent's class): its `--help`
    shows the defaults (`_Help`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        default = action.default
        shown = default is not None and not isinstance(default, bool)
        if action.help is None and action.option_strings and shown:
            action.help = "(default: %(default)s)"  # no words of help: its default, still
        return action


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="floorguard",
        description="A trusted floor under an untrusted learner, for multi-tenant LLM serving.",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"floorguard {package_version('floorguard')}, core: {running()}",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (simulate, verify, experiment, screen, http, init, keys, usage, bench):
        group.register(commands)
    return parser


_EVAL_EXTRA = frozenset({"scipy", "matplotlib"})
"""The packages of the `eval` extra: the experiment suite's statistics and fits, figures."""

BROKEN_PIPE = 141
"""The exit code of a command whose reader went away (`… --json | head`): 128 + SIGPIPE,
what a shell tool killed by it reports."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # soft_wrap: a line is never broken at the width (80 off a terminal): a log keeps each
    # line whole, and the listening line's URL stays readable by a program
    stderr = getattr(args, "json", False)
    console = Console(stderr=stderr, soft_wrap=True)
    try:
        return int(args.run(args, console))
    except FloorguardError as exc:
        print(f"floorguard {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # the reader closed the pipe: say nothing more, and keep the interpreter's own
        # flush at exit from raising again (the Python docs' recipe for SIGPIPE)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return BROKEN_PIPE
    except ModuleNotFoundError as exc:
        if exc.name not in _EVAL_EXTRA:
            raise
        print(
            f"floorguard {args.command}: error: this needs {exc.name}, in the evaluation "
            "extra: pip install 'floorguard[eval]' (serve does not)",
            file=sys.stderr,
        )
        return 2
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        print(
            f"floorguard {args.command}: error: cannot read {exc.filename}: {exc.strerror}",
            file=sys.stderr,
        )
        return 2
