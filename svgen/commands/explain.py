"""``svgen explain``: why each input got its classes — every score split into exact parts, and the support vectors,
prompts and shots that voted for and against it (:mod:`svgen.evaluation.explain`)."""

from __future__ import annotations

import json
import sys

from svgen.commands._common import HEAD_CHOICES, ExamplesFormatter, note
from svgen.commands._images import add_image_encoder_args, check_loader_args, encoder_for_artifact, load_features
from svgen.errors import SvgenError

PLOT_ROWS = 6   # inputs drawn by --plot (the first ones)


def add_parser(sub):
    p = sub.add_parser(
        "explain",
        help="why each input got its classes: score parts and the support vectors that voted",
        description="For each input (image files or folders, or rows of --features), its top-k classes under one "
                    "head with each score split into exact parts that add up to the score 'classify' prints: the "
                    "kernel head's zero-shot prior and the votes k(x̂, s)·A[s, c] of its support vectors; the linear "
                    "head's cosine part and the shots' (LDA) part; the mixture's two heads' probabilities and weight; "
                    "a pooled head's factor. For each class the support vectors voting most for and against it, "
                    "named by their origin (class and template group, generated slot, or labelled image with its "
                    "file path or row where the artifact recorded it), and the runner-up with the margin that would "
                    "flip the decision. Output: a table per input, --json (one object per line), --plot FILE.png.",
        epilog="examples:\n"
               "  svgen explain lvis.svgen photo.jpg\n"
               "  svgen explain pets.svgen --features val.npy --rows 0,5,9 --head kernel --json\n"
               "  svgen explain pets.svgen photos/ --plot why.png",
        formatter_class=ExamplesFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit' or 'svgen adapt'")
    p.add_argument("inputs", nargs="*", metavar="IMAGE|DIR", help="image files and/or folders (searched recursively)")
    p.add_argument("--features", metavar="FEATS.npy", help="precomputed N×D image embeddings instead of images")
    p.add_argument("--rows", metavar="I,J,…", help="with --features: only these rows (0-based, comma-separated)")
    p.add_argument("--head", choices=HEAD_CHOICES, default=None,
                   help="the head to explain (default: the artifact's default head, as 'classify')")
    p.add_argument("-k", "--top-k", type=int, default=3, help="classes explained per input (default: %(default)s)")
    p.add_argument("--contributions", type=int, default=5, metavar="N",
                   help="support vectors listed for and against each class (default: %(default)s)")
    p.add_argument("--json", action="store_true", help="one JSON object per input (the parts as numbers)")
    p.add_argument("--plot", metavar="FILE.png",
                   help=f"draw the first {PLOT_ROWS} inputs: their top contributions per class, with thumbnails of "
                        "the input and of contributing shot images that are files (needs matplotlib)")
    p.add_argument("--force", action="store_true", help="overwrite --plot if it exists")
    add_image_encoder_args(p)
    p.set_defaults(func=run)


def parse_rows(text: str, n: int, path) -> list:
    """The rows named by ``--rows`` (``"0,5,9"``), each checked against the ``n`` rows of ``path``."""
    try:
        rows = [int(t) for t in text.split(",") if t.strip() != ""]
    except ValueError:
        raise SvgenError(f"--rows must be comma-separated row numbers, got {text!r}") from None
    if not rows:
        raise SvgenError("--rows names no row")
    bad = next((r for r in rows if not 0 <= r < n), None)
    if bad is not None:
        raise SvgenError(f"--rows: row {bad} is out of range: {path} has {n} rows (0..{n - 1})")
    return rows


def run(args) -> int:
    import torch

    from svgen import SVGClassifier
    from svgen.evaluation.explain import PARTS
    from svgen.evaluation.explanation import table

    if args.features and args.inputs:
        raise SvgenError("give images/folders or --features, not both")
    if not args.features and not args.inputs:
        raise SvgenError("nothing to explain: give image files or folders, or --features FEATS.npy")
    if args.rows and not args.features:
        raise SvgenError("--rows picks rows of --features; give --features FEATS.npy")
    if args.top_k < 1 or args.contributions < 0:
        raise SvgenError(f"--top-k must be at least 1 and --contributions at least 0, got {args.top_k} and "
                         f"{args.contributions}")
    if args.plot:
        from svgen.commands._images import check_out

        check_out(args.plot, args.force)
    clf = SVGClassifier.load(args.artifact)
    explainer = clf.explainer(args.head)   # a head the artifact lacks: one line, before any work
    if args.features:
        x = load_features(args.features, clf, mmap=True)
        rows = parse_rows(args.rows, x.shape[0], args.features) if args.rows else range(x.shape[0])
        feats = FeatureRows(clf, x, rows)   # read (memory-mapped) and checked a batch at a time

        def key(i):
            return {"source": str(args.features), "row": rows[i]}, None
    else:
        feats, paths = _encode(args, clf)

        def key(i):
            return {"path": paths[i]}, paths[i]
    provenance = clf.provenance_note()
    if provenance != "recorded":
        note(args, f"svgen explain: {provenance}")
    drawn, done = [], 0
    for batch in explainer.batches(feats, args.top_k, args.contributions):
        keys = [key(done + i) for i in range(len(batch))]
        done += len(batch)
        if args.json:   # the lines straight from the batch's arrays, one write per batch
            sys.stdout.write(batch.json_lines([_key_json(k) for k, _ in keys]))
        if args.json and not (args.plot and len(drawn) < PLOT_ROWS):
            continue
        for row, (k, image) in zip(batch.rows(), keys):
            row.key = k
            if not args.json:
                title = k["path"] if image else f"{k['source']}[{k['row']}]"
                sys.stdout.write(table(row, PARTS, f"{title}  ({row.head} head)") + "\n")
            if args.plot and len(drawn) < PLOT_ROWS:
                drawn.append((row, image))
    sys.stdout.flush()
    if args.plot:
        from svgen.evaluation.explain_plot import plot_explanations

        with torch.no_grad():
            plot_explanations(drawn, args.plot, force=args.force)
        note(args, f"wrote {args.plot}: {len(drawn)} input(s)")
    return 0


class FeatureRows:
    """Rows ``rows`` of a memory-mapped features array, read and checked by the slice the explainer asks for."""

    def __init__(self, clf, x, rows):
        self.clf, self.x, self.rows = clf, x, rows
        self.shape = (len(rows), x.shape[1])

    def __getitem__(self, part: slice):
        import numpy as np

        rows = self.rows[part]
        x = self.x[rows.start:rows.stop] if isinstance(rows, range) else self.x[rows]
        return self.clf._features(np.array(x, dtype=np.float32))   # a copy: the map is read-only


def _key_json(key: dict) -> str:
    """A row's key (``{"source", "row"}`` or ``{"path"}``) as the JSON members its line starts with."""
    return json.dumps(key)[1:-1]


def _encode(args, clf):
    """(N×D embeddings, paths) of the inputs; an image that does not decode is one error line."""
    from svgen.encoders.images import find_images

    paths = find_images(args.inputs)
    if not paths:
        raise SvgenError(f"no image files found in {', '.join(args.inputs)}")
    check_loader_args(args)
    encoder = encoder_for_artifact(args, clf)
    feats, ok, failed = encoder.encode_images(paths, batch_size=args.batch_size, num_workers=args.workers,
                                              progress=getattr(args, "progress", False), decode=args.decode)
    if failed:
        path, why = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise SvgenError(f"cannot explain {path}: {why}{more}")
    return clf._features(feats), ok
