"""Labelled images for ``svgen fit`` and ``svgen adapt``: ``--shots DIR`` or ``--shot-features/--shot-labels``."""

from __future__ import annotations

import logging

from svgen.errors import SvgenError
from svgen.commands._common import load_array

log = logging.getLogger(__name__)


def add_shot_args(p, required: bool = False) -> None:
    g = p.add_argument_group(
        "labelled images (few-shot)" + ("; one of" if required else ""),
        "Images with their classes correct the zero-shot heads (docs/usage.md, \"Labelled images (few-shot)\").")
    g.add_argument("--shots", metavar="DIR",
                   help="labelled image folder (ImageFolder layout or DIR/labels.csv), embedded with the "
                        "artifact's encoder")
    g.add_argument("--shot-features", metavar="X.npy", help="N×D image embeddings of the labelled images")
    g.add_argument("--shot-labels", metavar="Y.npy",
                   help="N integer class indices, in the order of the classes file, or N class names (a str "
                        "array) (with --shot-features)")


def wants_shots(args, required: bool = False) -> bool:
    """Check the shot options go together; True when some were given."""
    feats, labels, folder = args.shot_features, args.shot_labels, args.shots
    if folder and (feats or labels):
        raise SvgenError("give --shots DIR or --shot-features with --shot-labels, not both")
    if bool(feats) != bool(labels):
        raise SvgenError("--shot-features and --shot-labels go together; give both")
    if required and not (folder or feats):
        raise SvgenError("no labelled images: give --shots DIR, or --shot-features X.npy --shot-labels Y.npy")
    return bool(folder or feats)


def shot_arrays(args, classes, owner: str = "the artifact"):
    """(X, y, origins) from ``--shot-features``/``--shot-labels``, class names in y looked up in ``classes``
    (``owner``'s; indices are checked against them by the library); ``origins``: each shot's file and row, recorded
    in the artifact (``svgen explain`` names them)."""
    X = load_array(args.shot_features, "shot features")
    origins = [{"file": str(args.shot_features), "row": i} for i in range(X.shape[0])] if X.ndim else None
    return X, load_labels(args.shot_labels, classes, "shot labels", "--shot-labels", owner), origins


def load_labels(path, classes, what: str, flag: str, owner: str = "the artifact"):
    """N labels from a .npy: integer class indices as they are, or class names (a unicode array) as their indices
    in ``classes``; an unknown name is one line naming it."""
    return load_named_labels(path, classes, what, flag, owner)[0]


def load_named_labels(path, classes, what: str, flag: str, owner: str = "the artifact"):
    """(:func:`load_labels`, whether the file held class names rather than indices)."""
    from svgen.validation import label_indices

    y = load_array(path, what, strings=True)
    if y.dtype.kind != "U":
        return y, False
    example = f", e.g. {str(classes[0])!r}" if len(classes) else ""
    return label_indices(y, list(classes), what=f"{flag} {path}",
                         owner=f"{owner} (it has {len(classes)} classes{example})"), True


def shot_images(args, classes):
    """The labelled folder's paths and class indices (unknown class names fail here, before any encoding)."""
    from svgen.io.data import labelled_images

    return labelled_images(args.shots, classes)


def encode_shots(args, encoder, data, command: str):
    """(X, y, origins) for the readable images of a labelled folder (``origins``: their file paths, recorded in the
    artifact)."""
    import numpy as np

    from svgen.commands._images import encode_paths

    if not hasattr(args, "batch_size"):
        args.batch_size, args.workers = None, None  # the machine's (svgen.encoders.runtime)
    x, ok, _ = encode_paths(args, encoder, data.paths, command)
    label_of = dict(zip(data.paths, data.labels))
    return x, np.asarray([label_of[p] for p in ok], dtype=np.int64), [{"path": str(p)} for p in ok]
