"""``svgen`` command line: a thin shell over the library.

Each sub-command lives in ``svgen/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``. Only this module prints errors and exits: a :class:`SvgenError` becomes
one line on stderr and exit status 2; Ctrl-C exits 130.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import List, Optional

from . import __version__
from .errors import SvgenError

COMMANDS = ("fit", "classify", "eval", "export", "diagnose", "add-classes", "check-encoder")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="svgen",
        description="Support vector generation: turn CLIP's zero-shot classifier into a kernel machine "
                    "built from class names alone, then classify, evaluate, diagnose and export it.",
        epilog="Run 'svgen COMMAND --help' for a command's options. Set HF_HUB_OFFLINE=1 to never touch the network.",
    )
    parser.add_argument("--version", action="version", version=f"svgen {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bars, warnings only")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name.replace('-', '_')}", __package__)
        module.add_parser(sub)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    level = logging.WARNING if args.quiet or not args.verbose else (logging.INFO if args.verbose == 1 else logging.DEBUG)
    logging.basicConfig(level=level, format="svgen: %(levelname)s: %(message)s")
    if args.verbose < 2:
        logging.getLogger("root").setLevel(max(level, logging.WARNING))  # open_clip logs on the root logger
    args.progress = not args.quiet and sys.stderr.isatty() or os.environ.get("SVGEN_PROGRESS") == "1"
    try:
        return int(args.func(args) or 0)
    except SvgenError as e:
        print(f"svgen {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("svgen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
