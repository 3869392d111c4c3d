"""`svgen eval` (not built yet)."""

from ..errors import SvgenError


def add_parser(sub):
    p = sub.add_parser("eval", help="(not built yet)", description="Not built yet.")
    p.set_defaults(func=run)


def run(args):
    raise SvgenError("'svgen eval' is not built yet")
