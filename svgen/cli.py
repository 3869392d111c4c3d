"""``svgen`` command line: a thin shell over the library.

Each sub-command lives in ``svgen/commands/<name>.py`` with ``add_parser(subparsers)`` and
``run(args) -> int``. Only this module prints errors and exits: a :class:`SvgenError` becomes
one line on stderr and exit status 2; Ctrl-C exits 130; a reader that closes stdout early (``| head``) ends
the command quietly with status 0.

Every sub-command gets, from :func:`main` and :func:`build_parser` alone: options and paths in
any order (``classify ART --top-k 1 img.jpg`` = ``classify ART img.jpg --top-k 1``, argparse's
intermixed parsing), and the global ``-q``/``-v`` before or after the sub-command's name.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from typing import List, Optional

from svgen import __version__
from svgen.errors import SvgenError

COMMANDS = ("fit", "classify", "explain", "eval", "export", "diagnose", "add-classes", "adapt", "check-encoder")
VERBOSE_HELP = "log each step that takes time, with its duration, on stderr (-vv: debug detail too)"
QUIET_HELP = ("no progress bars, 'wrote …' lines or log lines on stderr, only warnings and errors; stdout, "
              "the command's result, is the same")


class ArgumentParser(argparse.ArgumentParser):
    """argparse with svgen's usage errors: one line naming the problem, one pointing to ``--help``
    (argparse's own prints the whole usage block first)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\nsee '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="svgen",
        description="Support vector generation: turn CLIP's zero-shot classifier into a kernel machine "
                    "built from class names alone, then classify, evaluate, diagnose and export it.",
        epilog="Run 'svgen COMMAND --help' for a command's options. Set HF_HUB_OFFLINE=1 to never touch the network.",
    )
    parser.add_argument("--version", action="version", version=f"svgen {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help=VERBOSE_HELP)
    parser.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f".commands.{name.replace('-', '_')}", __package__)
        module.add_parser(sub)
    for command in sub.choices.values():
        _add_global_flags(command)
    return parser


def _add_global_flags(p: argparse.ArgumentParser) -> None:
    """``-q``/``-v`` after the sub-command too; SUPPRESS keeps what came before it (``svgen -v fit -v`` = -vv)."""
    g = p.add_argument_group("global options (also accepted before the command)")
    g.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    g.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)


def parse_args(parser: argparse.ArgumentParser, argv: List[str]) -> argparse.Namespace:
    """Global options, then the sub-command's options and positionals in any order.

    argparse's plain parsing stops filling a ``nargs='*'`` positional at the first option, so
    ``classify ART --top-k 1 img.jpg`` would reject ``img.jpg``; the sub-command's own parser is
    therefore run with :meth:`~argparse.ArgumentParser.parse_intermixed_args`.
    """
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    at = next((i for i, a in enumerate(argv) if not a.startswith("-")), None)
    if at is None or argv[at] not in sub.choices:  # --help, --version, no or an unknown command
        return parser.parse_args(argv)
    args = parser.parse_args(argv[:at])
    args.command = argv[at]
    return sub.choices[argv[at]].parse_intermixed_args(argv[at + 1:], namespace=args)


ELAPSED_FORMAT = "svgen [%(seconds)6.1fs] %(levelname)s: %(message)s"


class _Elapsed(logging.Formatter):
    """``svgen [  12.3s] INFO: message``: each log line with the seconds since svgen started."""

    def format(self, record):
        record.seconds = record.relativeCreated / 1000   # since the logging module was imported: svgen's start
        return super().format(record)


def configure_logging(verbose: int, quiet: bool) -> None:
    """Warnings and errors always (``svgen: WARNING: …``); ``-v`` adds the library's INFO lines (each long step and
    its time), ``-vv`` DEBUG, both stamped with the seconds since the start. The library only logs (the ``svgen``
    logger); this is the one place that decides what reaches stderr."""
    level = logging.WARNING if quiet or not verbose else (logging.INFO if verbose == 1 else logging.DEBUG)
    handler = logging.StreamHandler()   # sys.stderr
    handler.setFormatter(_Elapsed(ELAPSED_FORMAT) if level < logging.WARNING
                         else logging.Formatter("svgen: %(levelname)s: %(message)s"))
    logging.basicConfig(level=level, handlers=[handler])   # a no-op where the root logger already has handlers
    if verbose < 2:
        logging.getLogger("root").setLevel(max(level, logging.WARNING))  # open_clip logs on the root logger
    # svgen's own records pass at the level asked for; otherwise they follow the root logger (an embedding
    # program's or pytest's settings stay untouched)
    logging.getLogger("svgen").setLevel(level if level < logging.WARNING else logging.NOTSET)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parse_args(parser, list(sys.argv[1:] if argv is None else argv))
    if not args.command:
        parser.print_help(sys.stderr)
        return 2
    configure_logging(args.verbose, args.quiet)
    args.progress = not args.quiet and sys.stderr.isatty() or os.environ.get("SVGEN_PROGRESS") == "1"
    try:
        from svgen.commands._common import check_args

        check_args(args)  # --device, and no output that destroys an input (every command)
        code = int(args.func(args) or 0)
        sys.stdout.flush()   # here, where a closed pipe is caught, not at exit
        return code
    except SvgenError as e:
        print(f"svgen {args.command}: error: {getattr(e, 'cli_message', e)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("svgen: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # the reader stopped early (`| head`): success, as for cat or grep; and no
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # traceback when Python flushes at exit
        return 0
    except Exception as e:  # a defect of svgen's own: still one line (the traceback with -vv)
        from svgen.encoders.install import torch_pair_error

        pair = torch_pair_error(e)   # not svgen's: torchvision built for another torch (any command, any import)
        if pair is not None:
            print(f"svgen {args.command}: error: {pair}", file=sys.stderr)
            return 2
        return _internal_error(args, e)


def _internal_error(args, e: Exception) -> int:
    """The last line of defence: an unexpected exception as one line on stderr and exit status 2."""
    first = (str(e).strip().splitlines() or [""])[0][:500]
    if getattr(args, "verbose", 0) >= 2:
        import traceback

        traceback.print_exc()
        print(f"svgen {args.command}: internal error: {type(e).__name__}: {first}", file=sys.stderr)
    else:
        print(f"svgen {args.command}: internal error: {type(e).__name__}: {first} (rerun with -vv for the traceback)",
              file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
