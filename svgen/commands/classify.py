"""``svgen classify``: the top-k classes of images (or of precomputed embeddings) under one head."""

from __future__ import annotations

import argparse
import csv
import io
import json
import logging

import numpy as np

from ..blocks import score
from ..errors import SvgenError
from ._common import note
from ._images import add_image_encoder_args, check_out, emit, encode_paths, encoder_for_artifact, load_features

log = logging.getLogger(__name__)


def add_parser(sub):
    p = sub.add_parser(
        "classify",
        help="classify images or embeddings with an artifact (top-k labels and scores)",
        description="Score each input with one head of an artifact and print a row per input: its path (or, "
                    "with --features, its row index) and the top-k class names with their scores. Folders are "
                    "searched recursively for images; files that are not readable images are reported on "
                    "stderr and skipped. Scores are kernel-vote scores (about the summed kernel mass of the class's "
                    "support vectors), linear logits, or cosine logits (100 · cosine similarity, plain CLIP); "
                    "--probs prints probabilities instead: softmax(logits / T) with the head's temperature "
                    "stored in the artifact (cosine: T = 1, CLIP's own softmax; kernel logits are log scores, "
                    "or the raw votes where adapt chose them: svgen.json calibration.kernel_logits).",
        epilog="examples:\n"
               "  svgen classify lvis.svgen photos/ --top-k 3\n"
               "  svgen classify lvis.svgen photos/ --probs --head linear\n"
               "  svgen classify lvis.svgen --features feats.npy --head cosine --format jsonl --out preds.jsonl\n"
               "  svgen classify pets.svgen photos/ --transductive\n"
               "  svgen classify pets.svgen photos/ --transductive --head kernel --probs\n"
               "  svgen classify lvis.svgen 'shards/*.tar' --engine ray --out preds.parquet\n"
               "  svgen classify lvis.svgen --features 'emb/*.npy' --engine ray --address auto --actors 8 "
               "--out preds.parquet",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit'")
    p.add_argument("--transductive", action="store_true",
                   help="use the inputs themselves as an unlabelled pool: embed once, adapt the artifact to them "
                        "(as 'svgen adapt --unlabelled'; the artifact on disk is not changed) and print each "
                        "input's transductive class probabilities; with --head, that adapted head's scores "
                        "(or --probs) instead (kernel: the vote re-solved with pool rows as support vectors). "
                        "Fewer inputs than classes: the inductive head's softmax, with a warning")
    p.add_argument("inputs", nargs="*", metavar="IMAGE|DIR",
                   help="image files and/or folders (searched recursively); with --engine ray also globs, "
                        "list files (.txt/.lst), tables of paths (.csv/.parquet) and WebDataset .tar shards")
    p.add_argument("--features", metavar="FEATS.npy", nargs="+",
                   help="precomputed N×D image embeddings instead of images (raw or normalised); several "
                        "files are read as one, in order; with --engine ray also .parquet shards and globs")
    p.add_argument("--head", choices=("kernel", "linear", "cosine"), default=None,
                   help="kernel vote (default), linear head, or cosine (the plain CLIP baseline); with "
                        "--transductive the default is the pool's posterior")
    p.add_argument("--probs", action="store_true",
                   help="print probabilities (each row sums to one over all classes) instead of scores")
    p.add_argument("-k", "-K", "--top-k", type=int, default=5,
                   help="classes per row; more than the artifact has gives all of them (default: %(default)s)")
    p.add_argument("--format", choices=("csv", "jsonl"), default=None,
                   help="csv: path,label_1,score_1,...; jsonl: one {path, labels, scores} object per line "
                        "(default: csv; --engine ray writes Parquet)")
    p.add_argument("--out", metavar="FILE", help="write here (atomically) instead of stdout")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    add_image_encoder_args(p)
    from .classify_ray import add_ray_args

    add_ray_args(p)
    p.set_defaults(func=run)


def format_rows(names, scores, classes, k: int, fmt: str, key: str = "path") -> str:
    """Render N×C ``scores`` as csv or jsonl rows of the top-k labels and scores."""
    from ..heads import topk

    values, indices = topk(scores, k)
    values, indices = values.tolist(), indices.tolist()
    k = len(values[0]) if values else min(k, len(classes))
    buf = io.StringIO()
    if fmt == "csv":
        w = csv.writer(buf, lineterminator="\n")
        w.writerow([key] + [f"{what}_{r}" for r in range(1, k + 1) for what in ("label", "score")])
        for name, vals, idx in zip(names, values, indices):
            row = [name]
            for v, i in zip(vals, idx):
                row += [classes[i], f"{v:.6g}"]
            w.writerow(row)
    else:
        for name, vals, idx in zip(names, values, indices):
            buf.write(json.dumps({key: name, "labels": [classes[i] for i in idx], "scores": vals},
                                 ensure_ascii=False) + "\n")
    return buf.getvalue()


def run(args) -> int:
    from .. import SVGClassifier

    if args.top_k < 1:
        raise SvgenError(f"--top-k must be at least 1, got {args.top_k}")
    from .classify_ray import check_local, run_ray

    if args.engine == "ray":
        return run_ray(args)
    check_local(args)
    args.format = args.format or "csv"
    if args.features and args.inputs:
        raise SvgenError("give images/folders or --features, not both")
    if not args.features and not args.inputs:
        raise SvgenError("nothing to classify: give image files or folders, or --features FEATS.npy")
    check_out(args.out, args.force)
    clf = SVGClassifier.load(args.artifact)
    head = args.head or clf.default_head_   # what the fit decided
    clf.progress = args.progress
    if args.features:
        import torch

        x = torch.from_numpy(np.concatenate([load_features(f, clf) for f in args.features]))
        scores = _transductive(clf, x, args) if args.transductive else score(clf, x, head, args.probs)
        names, key = list(range(x.shape[0])), "index"
    else:
        from ..encoders import find_images

        paths = find_images(args.inputs)
        if not paths:
            raise SvgenError(f"no image files found in {', '.join(args.inputs)}")
        encoder = encoder_for_artifact(args, clf)
        feats, names, _ = encode_paths(args, encoder, paths, "classify")
        scores = _transductive(clf, feats, args) if args.transductive else score(clf, feats, head, args.probs)
        key = "path"
    if args.top_k > len(clf.classes_):  # said once the inputs are known good, so an error stays one line
        note(args, f"svgen classify: --top-k {args.top_k} is more than the artifact's {len(clf.classes_)} classes; "
                   f"showing all {len(clf.classes_)}")
    emit(format_rows(names, scores, clf.classes_, args.top_k, args.format, key), args.out, args.force, args,
         f"{len(names)} row(s), {_what(args, head)}, top {min(args.top_k, len(clf.classes_))}, {args.format}")
    return 0


def _what(args, head: str) -> str:
    if args.transductive and args.head is None:
        return "transductive posterior"
    return ("transductive " if args.transductive else "") + f"{head} head"


def _transductive(clf, x, args):
    """The inputs' transductive class probabilities (the inputs are the pool), or with ``--head`` the
    adapted head's scores / probabilities on them."""
    if x.shape[0] < 2:
        raise SvgenError(f"--transductive needs at least 2 inputs to use as a pool, got {x.shape[0]}")
    clf.adapt(unlabelled=x)  # progress on rounds follows clf.progress (set from --quiet / the terminal)
    if args.head is None:
        return clf.transductive_labels_.float()
    return score(clf, x, args.head, args.probs)
