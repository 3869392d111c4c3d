"""Shared by ``classify`` and ``eval``: the image-encoder options, image encoding, output files.

Which encoder an artifact accepts is the library's :mod:`svgen.encoders.resolve`; here
:func:`encoder_for_artifact` passes it the options.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from svgen.errors import SvgenError
from svgen.commands._common import add_quick_gelu_arg, load_array, non_negative_int

log = logging.getLogger(__name__)


def add_image_encoder_args(p) -> None:
    g = p.add_argument_group(
        "encoder for images (default: the artifact's own)",
        "Images are embedded with the model the artifact was fit with, reloaded as recorded (weights' sha256 "
        "checked: a --checkpoint fit needs the same file again); an artifact fit from --prototypes needs --model "
        "and --pretrained/--checkpoint naming the model that made them.")
    g.add_argument("--model", default=None,
                   help="open_clip architecture, 'hf-hub:ORG/REPO', 'local-dir:PATH' or a model-config .json "
                        "(default: the artifact's)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="TAG", help="pretrained tag (default: the artifact's)")
    src.add_argument("--checkpoint", metavar="FILE", help="local weights file (must be the artifact's checkpoint)")
    add_quick_gelu_arg(g, artifact=True)
    g.add_argument("--device", default="auto",
                   help="cpu, cuda, cuda:N, mps or auto: CUDA if present, then MPS, else the CPU (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=None,
                   help="images per encoder batch (default: from the device: 256 on CUDA, 32 on the CPU)")
    g.add_argument("--workers", type=non_negative_int, default=None, metavar="N",
                   help="image-decoding worker processes (default: none for a couple of batches, else one per "
                        "usable core, all but one beside a GPU, at most 16)")
    g.add_argument("--decode", choices=("cpu", "gpu"), default="cpu",
                   help="cpu: PIL in the worker processes (default); gpu: JPEGs decoded, resized and normalised on "
                        "the CUDA device (nvjpeg), other files by PIL; needs a CUDA device")


def check_loader_args(args) -> None:
    """``--batch-size`` given is sensible (``None``: the machine's; ``--workers`` is checked by its argparse type)."""
    if getattr(args, "batch_size", None) is not None and args.batch_size < 1:
        raise SvgenError(f"--batch-size must be at least 1, got {args.batch_size}")


def encoder_for_artifact(args, clf):
    """The artifact's encoder for the command's options (:func:`svgen.encoders.resolve.encoder_for_artifact`)."""
    from svgen.encoders.resolve import EncoderRequest, encoder_for_artifact as resolve

    return resolve(EncoderRequest.from_options(args), clf)


def load_features(path, clf, mmap: bool = False):
    """N×D image embeddings from a .npy file, checked against the artifact's dimension (``mmap``:
    memory-mapped, read as it is used)."""
    x = load_array(path, "features", mmap=mmap)
    if x.ndim != 2:
        raise SvgenError(f"features file {path} has shape {x.shape}; expected N×D")
    if x.shape[1] != clf.n_features_in_:
        raise SvgenError(f"features have dimension {x.shape[1]} but the artifact expects {clf.n_features_in_}")
    if x.shape[0] == 0:
        raise SvgenError(f"features file {path} has no rows")
    return x


def encode_paths(args, encoder, paths, command: str):
    """Encode image files; prints one line per skipped file; errors when none could be read."""
    check_loader_args(args)
    feats, ok, failed = encoder.encode_images(paths, batch_size=args.batch_size, num_workers=args.workers,
                                              progress=getattr(args, "progress", False),
                                              decode=getattr(args, "decode", "cpu"))
    if not ok:
        raise SvgenError(f"none of the {len(paths)} file(s) could be read as an image "
                         f"(first: {failed[0][0]}: {failed[0][1]})")
    for path, why in failed:
        print(f"svgen {command}: skipped {path}: {why}", file=sys.stderr)
    if failed:
        print(f"svgen {command}: skipped {len(failed)} of {len(paths)} file(s) that are not readable images",
              file=sys.stderr)
    return feats, ok, failed


def emit(text: str, out, force: bool, args=None, what: str = "") -> None:
    """Print ``text`` to stdout, or write it atomically to ``out`` and say so on stderr (unless -q)."""
    if out:
        from svgen.safeio import atomic_text
        from svgen.commands._common import note

        atomic_text(out, text, force=force)
        note(args, f"wrote {out}" + (f": {what}" if what else ""))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def check_out(out, force: bool) -> None:
    """Fail before any expensive work when ``--out`` cannot be written."""
    if not out:
        return
    from svgen.safeio import check_replaceable_file

    p = Path(out)
    if p.is_dir():
        raise SvgenError(f"--out {p} is a folder; give a file name")
    check_replaceable_file(p)   # a link (/dev/stdout), device, FIFO or socket: never replaced, --force or not
    if os.path.lexists(p) and not force:
        raise SvgenError(f"{p} already exists; pass --force to overwrite it")
    if not p.resolve().parent.is_dir():
        raise SvgenError(f"cannot write {p}: folder {p.resolve().parent} does not exist")
