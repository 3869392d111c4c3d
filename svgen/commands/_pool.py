"""Unlabelled images for ``svgen fit`` and ``svgen adapt``: ``--unlabelled DIR`` or ``--unlabelled-features U.npy``."""

from __future__ import annotations

import logging
from typing import Optional

from svgen.errors import SvgenError
from svgen.commands._common import load_array
from svgen.state import Evidence

log = logging.getLogger(__name__)


def add_pool_args(p) -> None:
    g = p.add_argument_group(
        "unlabelled images (transductive)",
        "Images without labels, typically the ones to classify; the heads adapt to them only where held-out "
        "evidence says it is better (docs/usage.md, \"Unlabelled images (transductive)\").")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--unlabelled", metavar="DIR",
                     help="folder of images (searched recursively), embedded with the artifact's encoder")
    src.add_argument("--unlabelled-features", metavar="U.npy", help="N×D image embeddings without labels")


def wants_pool(args) -> bool:
    return bool(args.unlabelled or args.unlabelled_features)


def pool_paths(args):
    """The image files of ``--unlabelled DIR`` (found before any expensive work)."""
    from pathlib import Path

    from svgen.encoders.images import find_images

    if not Path(args.unlabelled).is_dir():
        raise SvgenError(f"--unlabelled: {args.unlabelled} is not a folder")
    paths = find_images([args.unlabelled])
    if not paths:
        raise SvgenError(f"--unlabelled: no image files found in {args.unlabelled}")
    return paths


def pool_array(args):
    return load_array(args.unlabelled_features, "unlabelled features")


def encode_pool(args, encoder, paths, command: str):
    """N×D embeddings of the readable images of the pool folder."""
    from svgen.commands._images import encode_paths

    if not hasattr(args, "batch_size"):
        args.batch_size, args.workers = None, None  # the machine's (svgen.encoders.runtime)
    x, _, _ = encode_paths(args, encoder, paths, command)
    return x


def pool_check_summary(td: dict) -> Optional[dict]:
    """The pool check's evidence for the printed summary (``svgen.json`` keeps all of it)."""
    check = td.get("check")
    if not check:
        return None
    keys = ("evidence", "adopt", "images", "top1", "top5", "nll", "agreement_pool", "agreement_inductive",
            "top5_agreement_pool", "top5_agreement_inductive", "powers")
    return {k: check[k] for k in keys if k in check}


def pool_note(clf) -> str:
    """One line on what the pool changed: kept (and which head is now the default) or not, and why (the typed
    outcome decides, :class:`svgen.state.PoolOutcome`; the record's ``fallback`` only says why in words)."""
    outcome, default_head = clf.pool_outcome_, clf.default_head_
    if not outcome.kept:
        return "the pool changed nothing: " + str(clf.transductive_["fallback"])
    factor = clf.heads_.pool_factor
    powers = factor.powers if factor is not None else {}
    kept = f"the pool was kept ({outcome.evidence.value if outcome.evidence else 'its check'} say it is better): "
    if powers and outcome.evidence is not Evidence.HALVES:   # with shots: heads × its class likelihood
        return (kept + " and ".join(f"the {h} head" for h in powers)
                + (" now carry" if len(powers) > 1 else " now carries") + " its class likelihood; the "
                f"{default_head} head is the default head")
    # without labels: the linear head is the transduction's posterior, the kernel head the same with its own prior
    return (kept + f"the {default_head} head is the default head"
            + ("; the kernel head now carries its class likelihood" if powers else ""))
