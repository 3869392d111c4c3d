"""``svgen adapt``: add labelled images and/or an unlabelled pool to an artifact (no text is re-encoded)."""

from __future__ import annotations

import logging

from svgen.commands._common import ExamplesFormatter, json_text, note
from svgen.commands._images import add_image_encoder_args
from svgen.commands._pool import add_pool_args, encode_pool, pool_array, pool_check_summary, pool_note, pool_paths, wants_pool
from svgen.commands._shots import add_shot_args, encode_shots, shot_arrays, shot_images, wants_shots

log = logging.getLogger(__name__)


def add_parser(sub):
    p = sub.add_parser(
        "adapt",
        help="add labelled images (few-shot) and/or unlabelled images (transductive) to an artifact",
        description="Add labelled images (shots) and/or unlabelled images (a pool) to an artifact and write a new "
                    "one. No text is re-encoded; images added earlier are kept.\n\n"
                    "    shots  the kernel and linear heads are corrected in closed form, every setting\n"
                    "           chosen on held-out shots (zero-shot is kept where the shots do not beat\n"
                    "           it); the default head becomes the mixture of the two\n"
                    "    pool   the heads adapt to images without labels (after the shots, or alone);\n"
                    "           kept only where held-out evidence says it is better\n"
                    "    out    svgen.json records every decision and why (fewshot, transductive,\n"
                    "           calibration); stdout gets one JSON summary (also with -q: it is the\n"
                    "           result), the 'wrote …' line goes to stderr\n\n"
                    "How each head is corrected, chosen and calibrated: docs/usage.md, \"Labelled images "
                    "(few-shot)\", \"Unlabelled images (transductive)\" and \"Probabilities and calibration\".",
        epilog="examples:\n"
               "  svgen adapt pets.svgen --shots pets-16shot/ --out pets-16.svgen\n"
               "  svgen adapt pets.svgen --shot-features X.npy --shot-labels y.npy --out pets-16.svgen\n"
               "  svgen adapt pets.svgen --unlabelled-features U.npy --out pets-pool.svgen\n"
               "  svgen adapt pets.svgen --shots pets-4shot/ --unlabelled photos/ --out pets-4-pool.svgen",
        formatter_class=ExamplesFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit' (or an earlier adapt)")
    p.add_argument("--out", required=True, metavar="NEW_DIR", help="artifact directory to write")
    p.add_argument("--force", action="store_true", help="replace --out if it exists")
    add_shot_args(p)
    add_pool_args(p)
    add_image_encoder_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from svgen import SVGClassifier

    pool = wants_pool(args)
    shots = wants_shots(args, required=not pool)
    from svgen.safeio import check_dir_target

    out = check_dir_target(args.out, args.force)  # before any work: only an artifact or an empty folder is replaced
    clf = SVGClassifier.load(args.artifact)
    clf.progress = args.progress
    paths = pool_paths(args) if args.unlabelled else None   # fail on a bad folder before any encoding
    data = shot_images(args, clf.class_names_) if args.shots else None
    encoder = None
    if args.shots or args.unlabelled:
        from svgen.commands._images import encoder_for_artifact

        encoder = encoder_for_artifact(args, clf)
    X = y = U = origins = None
    if shots:
        X, y, origins = encode_shots(args, encoder, data, "adapt") if args.shots else shot_arrays(args, clf.class_names_)
    if pool:
        U = encode_pool(args, encoder, paths, "adapt") if args.unlabelled else pool_array(args)
    clf.adapt(X, y, unlabelled=U, origins=origins)
    clf.save(out, force=args.force)
    fs, td = clf.fewshot_, clf.transductive_
    summary = {}
    if shots:
        summary.update({"kernel": fs["kernel"], "linear": fs["linear"], "default_head": fs["default_head"],
                        "mixture_weight": fs["head_choice"].get("mixture_weight"),
                        **({"classes_without_shots": fs["classes_without_shots"]} if fs.get("classes_without_shots")
                           else {}),
                        "temperatures": clf.temperatures_, "temperature_method": clf.calibration_.get("method"),
                        "kernel_logits": clf.kernel_logits_})
    if pool:
        summary["transductive"] = {**{k: td.get(k) for k in ("pool", "fallback", "prior_strength", "rounds",
                                                             "changed_from_prior", "heads")},
                                   "default_head": clf.default_head_, "check": pool_check_summary(td)}
    what = []
    if shots:
        what.append(f"{fs['shots']} shots over {fs['classes_with_shots']} of {len(clf.class_names_)} classes")
    if pool:
        what.append(f"an unlabelled pool of {td['pool']} images")
    note(args, f"wrote {out}: " + " and ".join(what))
    print(json_text(summary))
    if pool:
        note(args, pool_note(clf))
    return 0
