"""``python -m svgen``: the ``svgen`` command line (:func:`svgen.cli.main`)."""

import sys

from svgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
