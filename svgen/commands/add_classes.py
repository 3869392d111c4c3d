"""`svgen add-classes` (not built yet)."""

from ..errors import SvgenError


def add_parser(sub):
    p = sub.add_parser("add-classes", help="(not built yet)", description="Not built yet.")
    p.set_defaults(func=run)


def run(args):
    raise SvgenError("'svgen add-classes' is not built yet")
