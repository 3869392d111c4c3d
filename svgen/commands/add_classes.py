"""``svgen add-classes``: extend an artifact with new classes, no retraining."""

from __future__ import annotations

import os

from svgen.commands._common import HelpFormatter, add_encoder_args, load_array, note, text_prototypes


def add_parser(sub):
    p = sub.add_parser(
        "add-classes",
        help="add classes to an artifact (the shared generator expands their prototypes)",
        description="Encode the new classes' prompts with the artifact's encoder (or read their embeddings with "
                    "--prototypes), expand them with the artifact's trained generator, give them linear-head rows "
                    "and re-solve the vote weights over all classes; labelled images the artifact holds are solved in "
                    "again with the settings it was adapted with (svgen.json adapt_config; 'svgen fit --adapt-config', "
                    "'svgen adapt --config'). The artifact is replaced atomically, under a lock "
                    "beside it (.NAME.lock, removed afterwards) held from reading it: a concurrent add-classes or "
                    "fit --force on it waits, so no update is lost. "
                    "The names are checked against the artifact before any encoder is loaded, and prompts "
                    "already in the prompt cache are not encoded again.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit' (replaced in place)")
    p.add_argument("--classes", required=True, metavar="FILE|NAME",
                   help="new class names, one per line, or a built-in list (cifar10, cifar100, imagenet1k)")
    p.add_argument("--prototypes", metavar="EMB.npy", help="their text embeddings (C×D or C×T×D) instead of encoding")
    add_encoder_args(p, with_model_default=False)
    p.set_defaults(func=run)


def run(args) -> int:
    from svgen.errors import SvgenError
    from svgen.encoders.prompts import read_class_names
    from svgen.locks import artifact_lock

    names = read_class_names(args.classes)
    if not names:
        raise SvgenError(f"classes file {args.classes} is empty: expected one class name per line")
    if not os.path.isdir(args.artifact):   # not an artifact: the load says so in one line
        return _add(args, names)
    with artifact_lock(args.artifact):   # load to replace: a concurrent writer waits, so no update is lost
        return _add(args, names)


def _add(args, names) -> int:
    from svgen import SVGClassifier
    from svgen.errors import SvgenError
    from svgen.encoders.prompts import validate_new_classes

    clf = SVGClassifier.load(args.artifact)
    names = validate_new_classes(names, clf.class_names_, source=f"classes file {args.classes}")
    if args.prototypes:
        emb = load_array(args.prototypes, "prototypes")
        if emb.ndim not in (2, 3) or emb.shape[0] != len(names):
            raise SvgenError(f"prototypes file {args.prototypes} has shape {emb.shape}; expected {len(names)} rows "
                             "(C×D or C×T×D), one per new class")
    else:
        enc = clf.encoder_ or {}
        if enc.get("source") == "prototypes" or not enc.get("model"):
            raise SvgenError(f"{args.artifact} was fitted from precomputed embeddings; pass --prototypes for the new classes")
        templates = clf.templates_ or ["a photo of a {}."]
        args.model = args.model or enc["model"]
        self_contained = enc["model"].startswith(("hf-hub:", "local-dir:"))  # their weights come with the name
        if not args.checkpoint and enc.get("checkpoint_sha256") and not self_contained:
            raise SvgenError(f"{args.artifact} was fitted with checkpoint {enc.get('checkpoint')}; pass --checkpoint FILE")
        if not args.pretrained and not args.checkpoint:
            args.pretrained = enc.get("pretrained")
        if args.quick_gelu is None and enc.get("quick_gelu") is not None and not args.pretrained:
            args.quick_gelu = bool(enc["quick_gelu"])  # the artifact's activation (a tag decides its own)
        protos, _ = text_prototypes(args, names, templates, expect=enc)
        emb = protos.per_template.numpy()
    before = len(clf.class_names_)
    clf.add_classes(emb, names)
    # in place: through a symbolic link to the artifact folder too (--force itself never replaces a link)
    clf.save(os.path.realpath(args.artifact), force=True)
    note(args, f"wrote {args.artifact}: {before} → {len(clf.class_names_)} classes")
    return 0
