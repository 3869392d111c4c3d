"""`svgen export` (not built yet)."""

from ..errors import SvgenError


def add_parser(sub):
    p = sub.add_parser("export", help="(not built yet)", description="Not built yet.")
    p.set_defaults(func=run)


def run(args):
    raise SvgenError("'svgen export' is not built yet")
