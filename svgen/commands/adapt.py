"""``svgen adapt``: add labelled images to an artifact (no text is re-encoded)."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import SvgenError
from ._common import json_text, note
from ._images import add_image_encoder_args
from ._shots import add_shot_args, encode_shots, shot_arrays, shot_images, wants_shots

log = logging.getLogger(__name__)


def add_parser(sub):
    p = sub.add_parser(
        "adapt",
        help="add labelled images (few-shot) to an artifact; writes a new artifact",
        description="Labelled image embeddings join the artifact's text support vectors as support vectors of "
                    "their class. The kernel-vote head is re-solved in closed form over text + image rows, the "
                    "linear head becomes shared-covariance LDA with the text prototypes as prior means; σ, λ, "
                    "the text/image weight and the shrinkage are chosen by exact leave-one-out over the images. "
                    "No text is re-encoded. Classes without images keep their text support vectors. Images "
                    "added earlier are kept. The result is a format-2 artifact; svgen.json records the shots "
                    "per class and what leave-one-out chose under 'fewshot'.",
        epilog="examples:\n"
               "  svgen adapt pets.svgen --shots pets-16shot/ --out pets-16.svgen\n"
               "  svgen adapt pets.svgen --shot-features X.npy --shot-labels y.npy --out pets-16.svgen",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit' (or an earlier adapt)")
    p.add_argument("--out", required=True, metavar="NEW_DIR", help="artifact directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_shot_args(p, required=True)
    add_image_encoder_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from .. import SVGClassifier

    wants_shots(args, required=True)
    out = Path(args.out)
    if out.exists() and not args.force:
        raise SvgenError(f"{out} already exists; pass --force to overwrite it")
    clf = SVGClassifier.load(args.artifact)
    if args.shots:
        from ._images import encoder_for_artifact

        data = shot_images(args, clf.classes_)
        X, y = encode_shots(args, encoder_for_artifact(args, clf), data, "adapt")
    else:
        X, y = shot_arrays(args)
    clf.adapt(X, y)
    clf.save(out, force=args.force)
    fs = clf.fewshot_
    note(args, f"wrote {out}: {fs['shots']} shots over {fs['classes_with_shots']} of {len(clf.classes_)} classes")
    print(json_text({"kernel": fs["kernel"], "linear": fs["linear"], "loo_better_head": fs["loo_better_head"]}))
    return 0
