"""One module per ``svgen`` sub-command: ``add_parser(subparsers)`` and ``run(args)``."""
