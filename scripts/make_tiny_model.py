#!/usr/bin/env python
"""Write the tiny random-weight open_clip model the tests and the README's sessions use.

    python scripts/make_tiny_model.py tiny      # → tiny/svgen-tiny.json, tiny.safetensors, tiny.pt, local/

``svgen-tiny.json`` is an open_clip model config (embed_dim 32, a 1-layer 32-wide ViT, a 2-layer text
tower); ``tiny.safetensors`` / ``tiny.pt`` its weights (seed 0: the same bytes every time);
``local/`` the same model as a ``local-dir:`` folder. Its predictions mean nothing; it exercises every
loading path (``--model tiny/svgen-tiny.json --checkpoint tiny/tiny.safetensors``,
``--model local-dir:tiny/local``) in seconds and offline. The code is ``build_tiny_model`` in
``tests/conftest.py``, which the tests use.
"""

from __future__ import annotations

import argparse
import logging
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="Write the tests' tiny random-weight open_clip model.")
    ap.add_argument("folder", nargs="?", default="tiny", help="where to write it (default: %(default)s)")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)  # open_clip says "initialized randomly": that is the point here
    build = runpy.run_path(str(ROOT / "tests" / "conftest.py"))["build_tiny_model"]
    paths = build(Path(args.folder))
    names = [Path(paths[k]).name for k in ("config", "safetensors", "pt")]
    print(f"wrote {args.folder}/: {', '.join(names)}, local/ (--model local-dir:{args.folder}/local); "
          f"embed_dim {paths['dim']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
