"""``svgen classify``: the top-k classes of images (or of precomputed embeddings) under one head."""

from __future__ import annotations

import logging
import sys

import numpy as np

from svgen.engine.predictions import score
from svgen.errors import SvgenError
from svgen.steps import timed
from svgen.commands._common import HEAD_CHOICES, ExamplesFormatter, add_refused_flag, note
from svgen.commands._images import (add_image_encoder_args, check_loader_args, check_out, encode_paths,
                                    encoder_for_artifact, load_features)

log = logging.getLogger(__name__)


def add_parser(sub):
    p = sub.add_parser(
        "classify",
        help="classify images or embeddings with an artifact (top-k labels and scores)",
        description="Score each input with one head of an artifact and print a row per input: its path (or, with "
                    "--features, its index, features file and row), the top-k class names, their scores and the head. Folders are "
                    "searched recursively for images; files that are not readable images are reported on "
                    "stderr and skipped. Scores are kernel-vote scores (about the summed kernel mass of the class's "
                    "support vectors), linear logits, or cosine logits (100 · cosine similarity, plain CLIP); "
                    "--probs prints probabilities instead: softmax(logits / T) with the head's temperature "
                    "stored in the artifact (cosine: T = 1, CLIP's own softmax; kernel logits are log scores, "
                    "or the raw votes or floored log scores where adapt chose them: svgen.json "
                    "calibration.kernel_logits).",
        epilog="examples:\n"
               "  svgen classify lvis.svgen photos/ --top-k 3\n"
               "  svgen classify lvis.svgen photos/ --probs --head linear\n"
               "  svgen classify lvis.svgen --features feats.npy --head cosine --format jsonl --out preds.jsonl\n"
               "  svgen classify pets.svgen photos/ --transductive\n"
               "  svgen classify pets.svgen photos/ --transductive --head kernel --probs\n"
               "  svgen classify lvis.svgen 'shards/*.tar' --engine ray --out preds.parquet\n"
               "  svgen classify lvis.svgen --features 'emb/*.npy' --engine ray --address auto --actors 8 "
               "--out preds.parquet",
        formatter_class=ExamplesFormatter,
    )
    # nargs="?" so that `--features F.npy ART` (--features takes several files) gives ART back below
    p.add_argument("artifact", metavar="ARTIFACT_DIR", nargs="?", help="artifact written by 'svgen fit'")
    p.add_argument("--transductive", action="store_true",
                   help="use the inputs themselves as an unlabelled pool: embed once, adapt the artifact to them "
                        "(as 'svgen adapt --unlabelled'; the artifact on disk is not changed) and print each "
                        "input's transductive class probabilities; with --head, that head's scores (or --probs) "
                        "instead. The pool is kept only when held-out evidence says it is better (docs/usage.md, "
                        "\"Unlabelled images (transductive)\"); otherwise, and with fewer inputs than classes, the "
                        "inductive default head's probabilities, with a warning saying why")
    p.add_argument("inputs", nargs="*", metavar="IMAGE|DIR",
                   help="image files and/or folders (searched recursively); with --engine ray also globs, "
                        "list files (.txt/.lst), tables of paths (.csv/.parquet) and WebDataset .tar shards")
    p.add_argument("--features", metavar="FEATS.npy", nargs="+",
                   help="precomputed N×D image embeddings instead of images (raw or normalised); several "
                        "files are read as one, in order; with --engine ray also .parquet shards and globs")
    p.add_argument("--head", choices=HEAD_CHOICES, default=None,
                   help="kernel vote, linear head, cosine (the plain CLIP baseline), or mixture (after labelled "
                        "shots: the kernel and linear heads' probabilities averaged with the fitted weight; its "
                        "scores are log-probabilities); default: the head the fit chose (svgen.json), with "
                        "--transductive the pool's probabilities")
    p.add_argument("--probs", action="store_true",
                   help="print probabilities (each row sums to one over all classes) instead of scores")
    p.add_argument("-k", "--top-k", type=int, default=5,
                   help="classes per row; more than the artifact has gives all of them (default: %(default)s)")
    add_refused_flag(p, "-K", "is fit's --n-support (support vectors per class); classes per row are -k/--top-k")
    p.add_argument("--format", choices=("csv", "jsonl", "parquet"), default=None,
                   help="one schema in every format and engine: the key (path; or index, source, row with "
                        "--features), labels (top-k names), scores or, with --probs, probs (float32 in full), "
                        "head. csv: path,label_1,score_1,…,head; jsonl: one strict-JSON {path, labels, scores, "
                        "head} object per line (non-finite scores: null); parquet: list columns, needs --out "
                        "(default: from the --out suffix, else csv; a contradicting suffix is refused; "
                        "--engine ray writes Parquet)")
    p.add_argument("--out", metavar="FILE",
                   help="write here (atomically, streamed) instead of stdout; the name ends in .csv, .jsonl "
                        "(.ndjson) or .parquet (any other suffix is refused); '-' is stdout; --engine ray: a "
                        "folder, named FOLDER or FOLDER.parquet")
    p.add_argument("--force", action="store_true",
                   help="overwrite --out if it exists (only a regular file, or a folder of an earlier --engine ray "
                        "run, is replaced: never a symbolic link, device or FIFO)")
    add_image_encoder_args(p)
    from svgen.commands.classify_ray import add_ray_args

    add_ray_args(p)
    p.set_defaults(func=run)


IMAGE_CHUNK = 4096  # images embedded and written per step: memory stays bounded whatever N is


def run(args) -> int:
    from svgen import SVGClassifier
    from svgen.io.output import output_format, require_pyarrow

    _take_artifact(args)
    _refuse_embeddings_as_images(args)
    if args.top_k < 1:
        raise SvgenError(f"--top-k must be at least 1, got {args.top_k}")
    from svgen.commands.classify_ray import check_local, run_ray

    if args.engine == "ray":
        return run_ray(args)
    check_local(args)
    args.format = output_format(args.out, args.format)
    if args.format == "parquet" and not args.out:
        raise SvgenError("Parquet output needs --out FILE.parquet (stdout gets csv or jsonl)")
    if args.features and args.inputs:
        raise SvgenError("give images/folders or --features, not both")
    if not args.features and not args.inputs:
        raise SvgenError("nothing to classify: give image files or folders, or --features FEATS.npy")
    check_out(args.out, args.force)
    if args.format == "parquet":
        require_pyarrow()  # before any work
    with timed(log, f"loaded {args.artifact}"):
        clf = SVGClassifier.load(args.artifact)
    if args.head is None and not args.transductive:   # the head the fit decided (--transductive: the posterior)
        args.head = clf.default_head_
    head = args.head or clf.default_head_
    clf.progress = args.progress
    if args.features:
        # every file checked before output; a file listed twice is read twice (every input, in order, as images)
        arrays = [(f, load_features(f, clf, mmap=True)) for f in args.features]
        blocks = _feature_blocks(clf, arrays, head, args)
    else:
        from svgen.encoders.images import find_images

        paths = find_images(args.inputs)
        if not paths:
            raise SvgenError(f"no image files found in {', '.join(args.inputs)}")
        encoder = encoder_for_artifact(args, clf)
        blocks = _image_blocks(clf, encoder, paths, head, args)
    blocks = _warn_top_k_once(blocks, args, len(clf.class_names_))
    if args.transductive:   # the pool is adapted before the first row, so the head column can say what was kept
        blocks = _started(blocks)
    with timed(log, "classify: inputs scored and written") as info:
        n = _write(blocks, clf, args)
        info.append(f"{n} row(s), {_what(args)}, {len(clf.class_names_)} classes")
    if args.out:
        note(args, f"wrote {args.out}: {n} row(s), {_what(args)} {'probabilities' if _probs(args) else 'scores'}, "
                   f"top {min(args.top_k, len(clf.class_names_))}, {args.format}")
    return 0


def _refuse_embeddings_as_images(args) -> None:
    """``classify ART feats.npy``: a ``.npy`` file among the inputs is embeddings given without ``--features``
    (it would otherwise be asked an encoder for, then skipped as not an image)."""
    from pathlib import Path

    npy = [f for f in args.inputs or () if Path(f).suffix.lower() == ".npy" and not Path(f).is_dir()]
    if npy and not args.features:
        raise SvgenError(f"{npy[0]} is a .npy file, not an image: did you mean --features {' '.join(npy)}? (inputs "
                         "without --features are images and folders)")


def _take_artifact(args) -> None:
    """``classify --features F.npy ART [IMAGE…]``: ``--features`` takes several files and swallows every path after
    it. Embeddings are files (``.npy``, ``.parquet`` or a glob of them), so the first value that is a folder or names
    none of those is the ARTIFACT_DIR (a missing or damaged one is then reported by name), and any after it are
    inputs (refused with --features as when given first)."""
    from pathlib import Path

    from svgen.engine.blocks import FEATURE_SUFFIXES

    if args.artifact is not None or not args.features:
        if args.artifact is None:
            raise SvgenError("the ARTIFACT_DIR argument is missing: give the artifact written by 'svgen fit'")
        return

    def features_file(f: str) -> bool:
        return not Path(f).is_dir() and (Path(f).suffix.lower() in FEATURE_SUFFIXES or any(c in f for c in "*?["))

    at = next((i for i, f in enumerate(args.features) if not features_file(f)), None)
    if at is None:
        raise SvgenError("the ARTIFACT_DIR argument is missing (give it before or after --features FEATS.npy ...)")
    args.artifact = args.features.pop(at)
    args.inputs = args.features[at:] + list(args.inputs or [])
    del args.features[at:]


def _probs(args) -> bool:
    """Whether the values written are probabilities (the transductive posterior always is)."""
    return bool(args.probs) or (args.transductive and args.head is None)


def _head_name(args, clf) -> str:
    """What produced the numbers: ``transductive`` (the adapted default head) only where the pool was kept; a
    refused pool leaves the inductive default head, and the column names it."""
    if args.transductive and args.head is None:
        return "transductive" if getattr(args, "pool_kept", True) else clf.default_head_
    return args.head or "kernel"


def _started(blocks):
    """``blocks`` with its first block already produced (the transductive pool adapted), then the rest."""
    import itertools

    first = next(blocks, None)
    return itertools.chain(() if first is None else (first,), blocks)


def _write(blocks, clf, args) -> int:
    """Stream the blocks to stdout, or to ``--out`` through a temporary file renamed into place."""
    from svgen.safeio import atomic_file
    from svgen.io.output import write_parquet, write_text_rows

    k, probs, name = args.top_k, _probs(args), _head_name(args, clf)
    if not args.out:
        n = write_text_rows(sys.stdout, blocks, clf.class_names_, k, args.format, name, probs)
        sys.stdout.flush()
        return n
    written = []

    def writer(tmp):
        if args.format == "parquet":
            written.append(write_parquet(tmp, blocks, clf.class_names_, k, name, probs))
        else:
            with open(tmp, "w", encoding="utf-8", newline="") as f:
                written.append(write_text_rows(f, blocks, clf.class_names_, k, args.format, name, probs))

    atomic_file(args.out, writer, force=args.force)
    return written[0]


def _warn_top_k_once(blocks, args, C: int):
    """Said once the first block is scored (the inputs are known good), so an error stays one line."""
    first = True
    for block in blocks:
        if first and args.top_k > C:
            note(args, f"svgen classify: --top-k {args.top_k} is more than the artifact's {C} classes; "
                       f"showing all {C}")
        first = False
        yield block


def _feature_blocks(clf, arrays: list, head: str, args):
    """``arrays``: ``(file, N×D array)`` pairs in the order given, a file named twice twice."""
    import torch

    from svgen.io.output import feature_blocks, matrix_blocks

    if args.transductive:
        x = torch.from_numpy(np.concatenate([np.asarray(a, dtype=np.float32) for _, a in arrays]))
        keys = {"index": list(range(x.shape[0])),
                "source": [str(f) for f, a in arrays for _ in range(a.shape[0])],
                "row": [r for _, a in arrays for r in range(a.shape[0])]}
        yield from matrix_blocks(keys, _transductive(clf, x, args))
        return
    from svgen.steps import bar

    rows = bar(None, getattr(args, "progress", False), total=sum(a.shape[0] for _, a in arrays), desc="classify",
               unit="row")
    try:
        for keys, scores in feature_blocks(arrays, lambda chunk: score(clf, torch.from_numpy(chunk), head, args.probs)):
            if rows is not None:
                rows.update(len(keys["index"]))
            yield keys, scores
    finally:
        if rows is not None:
            rows.close()


def _image_blocks(clf, encoder, paths, head: str, args):
    """Embed and score the images ``IMAGE_CHUNK`` at a time; unreadable files are reported and skipped."""
    from svgen.io.output import matrix_blocks

    if args.transductive:
        feats, ok, _ = encode_paths(args, encoder, paths, "classify")
        yield from matrix_blocks({"path": list(ok)}, _transductive(clf, feats, args))
        return
    check_loader_args(args)
    n_ok = n_failed = 0
    unsaid = []  # skipped files are listed once some file was readable; if none is, the error is one line
    # One loader for all the paths (its workers keep decoding while a chunk is scored and written).
    for feats, ok, failed in encoder.iter_images(paths, batch_size=args.batch_size, num_workers=args.workers,
                                                 progress=getattr(args, "progress", False), chunk=IMAGE_CHUNK,
                                                 decode=args.decode):
        unsaid += failed
        n_ok, n_failed = n_ok + len(ok), n_failed + len(failed)
        if n_ok:
            for path, why in unsaid:
                print(f"svgen classify: skipped {path}: {why}", file=sys.stderr)
            unsaid = []
        if ok:
            yield {"path": list(ok)}, score(clf, feats, head, args.probs, device=getattr(encoder, "device", None))
    if not n_ok:
        raise SvgenError(f"none of the {len(paths)} file(s) could be read as an image "
                         f"(first: {unsaid[0][0]}: {unsaid[0][1]})")
    if n_failed:
        print(f"svgen classify: skipped {n_failed} of {len(paths)} file(s) that are not readable images",
              file=sys.stderr)


def _what(args) -> str:
    if args.transductive and args.head is None:
        if getattr(args, "pool_kept", True):
            return "transductive"
        return "inductive default head (the pool changed nothing)"
    return ("transductive " if args.transductive else "") + f"{args.head or 'kernel'} head"


def _transductive(clf, x, args):
    """The inputs' transductive class probabilities (the inputs are the pool): the adapted default head's
    probabilities on them, exactly what ``adapt --unlabelled`` then ``classify --probs`` gives (a refused pool: the
    inductive default head's); with ``--head`` the adapted head's scores / probabilities on them."""
    if x.shape[0] < 2:
        raise SvgenError(f"--transductive needs at least 2 inputs to use as a pool, got {x.shape[0]}")
    clf.adapt(unlabelled=x)  # progress on rounds follows clf.progress (set from --quiet / the terminal)
    args.pool_kept = clf.pool_outcome_.kept   # for the 'wrote' line: what the numbers are
    if args.head is None:   # the adapted artifact's own default head: as `classify --probs` would score these inputs
        return score(clf, x, clf.default_head_, True)
    return score(clf, x, args.head, args.probs)
