"""Shared by ``classify`` and ``eval``: the artifact's own encoder, image encoding, output files.

The encoder that embeds images must be the one the artifact was fit with:

* an artifact fit from an open_clip model records ``model``, ``pretrained`` or ``checkpoint`` +
  ``checkpoint_sha256``, and ``embed_dim``. The model and tag default to the recorded ones; a
  different ``--model``/``--pretrained`` is refused; a checkpoint artifact needs
  ``--checkpoint FILE`` whose sha256 matches. ``hf-hub:`` and ``local-dir:`` artifacts reload the
  recorded name with no extra flags (``--model local-dir:OTHER`` for a moved copy) and the
  loaded weights' sha256 must match the recorded one. The MLP activation (``quick_gelu``) is the recorded
  one; an encoder built with the other is refused. Artifacts from before svgen recorded it get a
  warning when today's activation differs from what open_clip built then (see
  :func:`svgen.encoders.check_artifact_activation`).
* an artifact fit with ``--prototypes`` does not know its encoder: the user names it with
  ``--model`` and ``--pretrained``/``--checkpoint``, and only the dimension can be checked.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ..errors import SvgenError
from ._common import add_quick_gelu_arg, load_array

log = logging.getLogger(__name__)


def add_image_encoder_args(p) -> None:
    g = p.add_argument_group(
        "encoder for images (default: the artifact's own)",
        "Images are embedded with the model the artifact was fit with: a tag, hf-hub: or local-dir: "
        "name is reloaded as recorded (hf-hub:/local-dir: weights' sha256 is checked). Artifacts fit from a "
        "--checkpoint need the same file again (its sha256 is checked); artifacts fit from "
        "--prototypes need --model and --pretrained/--checkpoint naming the model that made them.")
    g.add_argument("--model", default=None,
                   help="open_clip architecture, 'hf-hub:ORG/REPO', 'local-dir:PATH' or a model-config .json "
                        "(default: the artifact's)")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--pretrained", metavar="TAG", help="pretrained tag (default: the artifact's)")
    src.add_argument("--checkpoint", metavar="FILE", help="local weights file (must be the artifact's checkpoint)")
    add_quick_gelu_arg(g, ": the artifact's recorded activation; without one")
    g.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default: %(default)s)")
    g.add_argument("--batch-size", type=int, default=32, help="images per encoder batch (default: %(default)s)")
    g.add_argument("--workers", type=int, default=None, metavar="N",
                   help="image-decoding worker processes (default: 0 for small inputs, else up to 4)")


def _model_name(model: str) -> str:
    return Path(model).stem if model.endswith(".json") else model


_SELF_CONTAINED = ("hf-hub:", "local-dir:")  # names that carry their own config and weights


def _self_contained_model(args, enc):
    """(model, pretrained) for an artifact fit from ``hf-hub:`` or ``local-dir:``: the recorded name
    reloads config and weights, so no --checkpoint/--pretrained; ``--model local-dir:OTHER`` may
    point at a moved copy (its weights' sha256 is checked after loading)."""
    want = enc["model"]
    if args.checkpoint or args.pretrained:
        flag = "--checkpoint" if args.checkpoint else "--pretrained"
        raise SvgenError(f"the artifact was fit from {want}, which holds its own weights; drop {flag}")
    if args.model and args.model != want and not (args.model.startswith("local-dir:") and want.startswith("local-dir:")):
        raise SvgenError(f"--model {args.model} does not match the artifact's encoder {want!r}; "
                         "images must be embedded by the model the artifact was fit with")
    return args.model or want, None


def check_weights_sha256(recorded: dict, encoder) -> None:
    """Refuse (one line) weights whose sha256 differs from the one the artifact recorded."""
    want, got = recorded.get("checkpoint_sha256"), encoder.checkpoint_sha256
    if want and got and want != got:
        raise SvgenError(f"the weights of {encoder.model_name} (sha256 {got[:12]}…) are not the ones the artifact was "
                         f"fit with ({recorded['model']}, sha256 {want[:12]}…)")


def encoder_for_artifact(args, clf):
    """Load the encoder the artifact expects, refusing any mismatch with one clear line."""
    from ..encoders import ClipEncoder, activation_flag, activation_name, check_artifact_activation, file_sha256

    enc = clf.encoder_ or {}
    dim = clf.n_features_in_
    if enc.get("source") == "prototypes" or not enc.get("model"):
        if not args.model:
            src = f" ({enc['file']})" if enc.get("file") else ""
            raise SvgenError(f"this artifact was fit from precomputed prototypes{src}, so it does not know which "
                             "model embeds images; name it with --model and --pretrained/--checkpoint")
        pretrained = args.pretrained
        if not pretrained and not args.checkpoint and not args.model.startswith(("hf-hub:", "local-dir:")) \
                and not args.model.endswith(".json"):
            pretrained = "openai"
        model = args.model
    elif enc["model"].startswith(_SELF_CONTAINED):
        model, pretrained = _self_contained_model(args, enc)
    else:
        want = enc["model"]
        if args.model and _model_name(args.model) != want:
            raise SvgenError(f"--model {args.model} does not match the artifact's encoder {want!r}; "
                             "images must be embedded by the model the artifact was fit with")
        model = args.model or want
        if enc.get("checkpoint_sha256"):
            if args.pretrained:
                raise SvgenError(f"the artifact was fit from checkpoint {enc.get('checkpoint')!r}, not pretrained "
                                 f"tag {args.pretrained!r}; pass --checkpoint FILE")
            if not args.checkpoint:
                raise SvgenError(f"the artifact was fit from checkpoint {enc.get('checkpoint')!r}; pass it with "
                                 "--checkpoint FILE")
            sha = file_sha256(args.checkpoint)
            if sha != enc["checkpoint_sha256"]:
                raise SvgenError(f"checkpoint {args.checkpoint} (sha256 {sha[:12]}…) is not the one the artifact was "
                                 f"fit with ({enc.get('checkpoint')}, sha256 {enc['checkpoint_sha256'][:12]}…)")
            pretrained = None
        else:
            if args.checkpoint:
                tag = enc.get("pretrained")
                raise SvgenError(f"the artifact was fit from {want}" + (f" pretrained {tag!r}" if tag else "")
                                 + ", not from a checkpoint file; drop --checkpoint")
            if args.pretrained and args.pretrained != enc.get("pretrained"):
                raise SvgenError(f"--pretrained {args.pretrained} does not match the artifact's encoder "
                                 f"({want}, pretrained {enc.get('pretrained')!r})")
            pretrained = enc.get("pretrained")
        if not args.model and not want.startswith(("hf-hub:", "local-dir:")):
            import open_clip

            if want not in open_clip.list_models():
                raise SvgenError(f"the artifact's encoder {want!r} is not a built-in open_clip architecture; "
                                 "pass --model with its model-config .json")
        edim = enc.get("embed_dim")
        if edim is not None and int(edim) != dim:
            raise SvgenError(f"the artifact records embed_dim {edim} but its tensors have dimension {dim}")
    quick_gelu = getattr(args, "quick_gelu", None)
    recorded = enc.get("quick_gelu")
    if recorded is not None:
        if quick_gelu is not None and quick_gelu != bool(recorded):
            raise SvgenError(f"{activation_flag(quick_gelu)} contradicts the artifact, whose encoder was built with "
                             f"{activation_name(bool(recorded))}; images must be embedded the way its prompts were")
        if not pretrained:  # a tag decides its own activation; a mismatch is refused just below
            quick_gelu = bool(recorded)
    encoder = ClipEncoder(model, pretrained=pretrained, checkpoint=args.checkpoint, device=args.device,
                          quick_gelu=quick_gelu)
    if enc.get("model") and enc.get("source") != "prototypes":
        check_artifact_activation(enc, encoder)
        if enc["model"].startswith(_SELF_CONTAINED):
            check_weights_sha256(enc, encoder)
    got = encoder.embed_dim
    if got != dim:
        raise SvgenError(f"{model} embeds to dimension {got} but the artifact expects {dim}; "
                         "use the model the artifact was fit with")
    return encoder


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
    if args.batch_size < 1:
        raise SvgenError(f"--batch-size must be at least 1, got {args.batch_size}")
    feats, ok, failed = encoder.encode_images(paths, batch_size=args.batch_size, num_workers=args.workers,
                                              progress=getattr(args, "progress", False))
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
        from ..export import write_text_atomic
        from ._common import note

        write_text_atomic(out, text, force=force)
        note(args, f"wrote {out}" + (f": {what}" if what else ""))
    else:
        sys.stdout.write(text)
        sys.stdout.flush()


def check_out(out, force: bool) -> None:
    """Fail before any expensive work when ``--out`` cannot be written."""
    if not out:
        return
    p = Path(out)
    if p.is_dir():
        raise SvgenError(f"--out {p} is a folder; give a file name")
    if p.exists() and not force:
        raise SvgenError(f"{p} already exists; pass --force to overwrite it")
    if not p.resolve().parent.is_dir():
        raise SvgenError(f"cannot write {p}: folder {p.resolve().parent} does not exist")
