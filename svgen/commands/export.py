"""``svgen export``: an artifact's head as a safetensors/npz head file or an ONNX graph."""

from __future__ import annotations

import logging

from svgen.errors import SvgenError
from svgen.commands._common import ExamplesFormatter, note

log = logging.getLogger(__name__)

SUFFIX = {"safetensors": ".safetensors", "npz": ".npz", "onnx": ".onnx"}


def add_parser(sub):
    p = sub.add_parser(
        "export",
        help="export a head as safetensors/npz (open_clip-style D×C classifier) or ONNX",
        description="Write one head of an artifact as a self-contained file that needs neither svgen nor pickle.\n\n"
                    "safetensors / npz, --head linear or cosine: 'weight' (D×C), 'bias' (C) and "
                    "'logit_scale' (100), so that\n"
                    "    logits = logit_scale * (x/||x|| @ weight + bias)\n"
                    "reproduces svgen's scores; '100. * image_features @ weight' is the open_clip idiom. "
                    "--head kernel writes 'support_vectors' (M×D), 'bandwidth' and 'vote_weights' (M×C). "
                    "--head mixture (after labelled shots) writes both heads, their tensors prefixed 'kernel.' "
                    "and 'linear.', and 'mixture_weight' w: probs = w·p_kernel + (1 − w)·p_linear.\n"
                    "Class names, the encoder identity and the formula travel in the file's metadata.\n\n"
                    "onnx (needs svgen[onnx]): a graph from 'embeddings' (N×D raw image embeddings) to 'scores' "
                    "(N×C) and 'probs' for the linear, kernel, cosine or mixture head, checked against svgen with "
                    "onnxruntime "
                    "before it is written.",
        epilog="examples:\n"
               "  svgen export lvis.svgen --head linear --format safetensors --out lvis-linear.safetensors\n"
               "  svgen export lvis.svgen --format onnx --head kernel --out lvis-kernel.onnx\n"
               "then: python scripts/zero_shot_classify.py lvis-linear.safetensors photos/",
        formatter_class=ExamplesFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit'")
    p.add_argument("--format", choices=tuple(SUFFIX), default=None,
                   help="file format (default: from the --out suffix; a suffix naming another format is refused)")
    p.add_argument("--head", choices=("linear", "kernel", "cosine", "mixture"), default=None,
                   help="which head to export (default: the artifact's default head, the one classify uses)")
    p.add_argument("--out", required=True, metavar="FILE", help="file to write (atomically)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--no-verify", action="store_true", help="skip the onnxruntime check of an ONNX export")
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from svgen import SVGClassifier
    from svgen.io.export import export_head
    from svgen.commands._images import check_out

    fmt = args.format
    by_suffix = {v: k for k, v in SUFFIX.items()}
    implied = by_suffix.get(Path(args.out).suffix.lower())
    if fmt is None:
        fmt = implied
        if fmt is None:
            raise SvgenError(f"cannot tell the format from {args.out!r}; pass --format safetensors, npz or onnx")
    elif implied is not None and implied != fmt:
        raise SvgenError(f"--out {args.out} names a {implied} file but --format is {fmt}; "
                         f"use a {SUFFIX[fmt]} name or drop --format")
    check_out(args.out, args.force)
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
        except ImportError:
            raise SvgenError("ONNX export needs the onnx package: pip install 'svgen[onnx]'") from None
    clf = SVGClassifier.load(args.artifact)
    args.head = args.head or clf.default_head_
    info = export_head(clf, args.out, fmt, head=args.head, force=args.force, verify=not args.no_verify)
    C, D = len(clf.class_names_), clf.n_features_in_
    checked = "" if info["checked"] is None else f"; onnxruntime matches svgen (max |difference| {info['checked']:.2g})"
    note(args, f"wrote {args.out}: {args.head} head, {fmt}, {C} classes, D={D}{checked}")
    return 0
