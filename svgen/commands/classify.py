"""`svgen classify` (not built yet)."""

from ..errors import SvgenError


def add_parser(sub):
    p = sub.add_parser("classify", help="(not built yet)", description="Not built yet.")
    p.set_defaults(func=run)


def run(args):
    raise SvgenError("'svgen classify' is not built yet")
