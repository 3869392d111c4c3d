"""Which encoder: the one a fit names (:func:`load_encoder`, :func:`text_prototypes`), and for an artifact the
one it was fit with and nothing else (:func:`encoder_for_artifact`).

The encoder that embeds images must be the one the artifact was fit with:

* an artifact fit from an open_clip model records ``model``, ``pretrained`` or ``checkpoint`` +
  ``checkpoint_sha256``, and ``embed_dim``. The model and tag default to the recorded ones; a
  different ``--model``/``--pretrained`` is refused; a checkpoint artifact needs
  ``--checkpoint FILE`` whose sha256 matches. ``hf-hub:`` and ``local-dir:`` artifacts reload the
  recorded name with no extra flags (``--model local-dir:OTHER`` for a moved copy) and the
  loaded weights' sha256 must match the recorded one. The MLP activation (``quick_gelu``) is the recorded
  one; an encoder built with the other is refused. Artifacts from before svgen recorded it get a
  warning when today's activation differs from what open_clip built then (see
  :func:`svgen.encoders.activation.check_artifact_activation`).
* an artifact fit with ``--prototypes`` does not know its encoder: the user names it with
  ``--model`` and ``--pretrained``/``--checkpoint``, and only the dimension can be checked.

The request (:class:`EncoderRequest`) holds what the user named (``svgen fit --model …`` and the like; everything
optional). Messages name the command-line options, which are how users pass them.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from svgen.errors import SvgenError
from svgen.steps import timed

log = logging.getLogger(__name__)

DEFAULT_MODEL = "ViT-B-32"


def options_error(cli_text: str) -> SvgenError:
    """A refusal that names the encoder options: the command line's words (``--checkpoint FILE``) for the CLI, the
    Python keywords (``checkpoint=FILE``) for everyone else."""
    opt = r"--(model|pretrained|checkpoint)"
    text = re.sub(opt + r" (FILE|TAG|\S*[^a-z\s;,]\S*)", r"\1=\2", cli_text)   # an option and its value
    return SvgenError(re.sub(opt + r"\b", r"\1", text), cli=cli_text)   # an option named alone


@dataclass(frozen=True)
class EncoderRequest:
    """What the user asked for: ``model``, ``pretrained`` or ``checkpoint``, the activation, the device."""

    model: Optional[str] = None
    pretrained: Optional[str] = None
    checkpoint: Optional[str] = None
    quick_gelu: Optional[bool] = None
    device: str = "auto"
    progress: bool = False

    @classmethod
    def from_options(cls, options) -> "EncoderRequest":
        """From any object with those attributes (an ``argparse.Namespace``); missing ones take the defaults."""
        return cls(**{k: getattr(options, k, v) for k, v in
                      (("model", None), ("pretrained", None), ("checkpoint", None), ("quick_gelu", None),
                       ("device", "auto"), ("progress", False))})

    @property
    def model_or_default(self) -> str:
        return self.model or DEFAULT_MODEL

    @property
    def pretrained_or_default(self) -> Optional[str]:
        """The pretrained tag implied: a plain built-in architecture defaults to 'openai'."""
        if self.pretrained or self.checkpoint:
            return self.pretrained
        model = self.model_or_default
        if model.startswith(("hf-hub:", "local-dir:")) or model.endswith(".json"):
            return None
        return "openai"


def load_encoder(request: EncoderRequest):
    """A :class:`~svgen.encoders.clip.ClipEncoder` for the request (default model and tag filled in)."""
    from svgen.encoders.clip import ClipEncoder

    with timed(log, f"encoder {request.model_or_default} loaded"):
        return ClipEncoder(request.model_or_default, pretrained=request.pretrained_or_default,
                           checkpoint=request.checkpoint, device=request.device, quick_gelu=request.quick_gelu)


def _describe_encoder(identity: dict, other: dict) -> str:
    """``model, tag-or-checkpoint``, plus what tells it from ``other`` when that reads the same
    (a checkpoint's sha256, the activation)."""
    text = f"{identity.get('model')}, {identity.get('pretrained') or identity.get('checkpoint')}"
    other_text = f"{other.get('model')}, {other.get('pretrained') or other.get('checkpoint')}"
    if text == other_text:
        sha, other_sha = identity.get("checkpoint_sha256"), other.get("checkpoint_sha256")
        if sha != other_sha:
            text += f", sha256 {sha[:12]}…" if sha else ", no sha256"
        elif identity.get("quick_gelu") != other.get("quick_gelu"):
            text += ", QuickGELU" if identity.get("quick_gelu") else ", GELU"
    return text


def encoder_mismatch(identity: dict, expect: dict) -> SvgenError:
    """One line naming both encoders so that they read differently."""
    return SvgenError(f"the encoder ({_describe_encoder(identity, expect)}) does not match the one the artifact "
                      f"was fitted with ({_describe_encoder(expect, identity)})")


def text_prototypes(request: EncoderRequest, classes, templates, expect: dict = None):
    """``(Prototypes, encoder identity)`` of ``classes`` × ``templates`` under the requested encoder.

    When every prompt is already in the prompt cache, the encoder is not loaded at all (the identity, a
    checkpoint's sha256 included, is known without it). ``expect``, an artifact's recorded encoder, is compared
    before anything is loaded.
    """
    from svgen.encoders.activation import check_artifact_activation
    from svgen.encoders.identity import encoder_identity, identity_key
    from svgen.encoders.prototypes import build_prototypes, cached_prototypes

    pretrained = request.pretrained_or_default
    ident = encoder_identity(request.model_or_default, pretrained, request.checkpoint, request.quick_gelu)

    def same(identity):  # an artifact from before svgen recorded the activation matches on the rest
        want = {**expect, "quick_gelu": expect.get("quick_gelu", identity.get("quick_gelu"))}
        if str(want.get("model")).startswith("hf-hub:") and not want.get("checkpoint_sha256"):
            want["checkpoint_sha256"] = identity.get("checkpoint_sha256")  # from before svgen hashed hf-hub: weights
        return identity_key(identity) == identity_key(want)

    if expect is not None and ident is not None and not same(ident):
        raise encoder_mismatch(ident, expect)
    if ident is not None:
        protos = cached_prototypes(identity_key(ident), classes, templates)
        if protos is not None:
            log.info("all %d prompts are in the prompt cache; the encoder is not loaded", len(classes) * len(templates))
            return protos, ident
    from svgen.encoders.hub import check_weights_reachable

    check_weights_reachable(request.model_or_default, pretrained)  # fail fast, before torch loads
    encoder = load_encoder(request)
    if expect is not None:
        check_artifact_activation(expect, encoder)  # a different activation: refused; none recorded: a warning
    if expect is not None and not same(encoder.identity()):
        raise encoder_mismatch(encoder.identity(), expect)
    with timed(log, "text prototypes") as info:
        protos = build_prototypes(encoder, classes, templates, progress=request.progress)
        n = len(classes) * len(templates)
        info.append(f"{n} prompts, {n - protos.encoded} from the prompt cache")
    return protos, encoder.identity()


def _model_name(model: str) -> str:
    return Path(model).stem if model.endswith(".json") else model


_SELF_CONTAINED = ("hf-hub:", "local-dir:")  # names that carry their own config and weights


def _self_contained_model(args: EncoderRequest, enc):
    """(model, pretrained) for an artifact fit from ``hf-hub:`` or ``local-dir:``: the recorded name
    reloads config and weights, so no --checkpoint/--pretrained; ``--model local-dir:OTHER`` may
    point at a moved copy (its weights' sha256 is checked after loading)."""
    want = enc["model"]
    if args.checkpoint or args.pretrained:
        flag = "--checkpoint" if args.checkpoint else "--pretrained"
        raise SvgenError(f"the artifact was fit from {want}, which holds its own weights; drop {flag}")
    if args.model and args.model != want and not (args.model.startswith("local-dir:") and want.startswith("local-dir:")):
        raise options_error(f"--model {args.model} does not match the artifact's encoder {want!r}; "
                         "images must be embedded by the model the artifact was fit with")
    return args.model or want, None


def check_weights_sha256(recorded: dict, encoder) -> None:
    """Refuse (one line) weights whose sha256 differs from the one the artifact recorded."""
    want, got = recorded.get("checkpoint_sha256"), encoder.checkpoint_sha256
    if want and got and want != got:
        raise SvgenError(f"the weights of {encoder.model_name} (sha256 {got[:12]}…) are not the ones the artifact was "
                         f"fit with ({recorded['model']}, sha256 {want[:12]}…)")


def encoder_for_artifact(args: EncoderRequest, clf):
    """Load the encoder the artifact ``clf`` expects for ``args`` (what the user asked for), refusing any mismatch
    with one clear line."""
    from svgen.encoders.clip import ClipEncoder
    from svgen.encoders.activation import activation_flag, activation_name, check_artifact_activation
    from svgen.encoders.identity import file_sha256

    enc = clf.encoder_ or {}
    dim = clf.n_features_in_
    if enc.get("source") == "prototypes" or not enc.get("model"):
        if not args.model:
            src = f" ({enc['file']})" if enc.get("file") else ""
            raise options_error(f"this artifact was fit from precomputed prototypes{src}, so it does not know which "
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
            raise options_error(f"--model {args.model} does not match the artifact's encoder {want!r}; "
                             "images must be embedded by the model the artifact was fit with")
        model = args.model or want
        if enc.get("checkpoint_sha256"):
            if args.pretrained:
                raise options_error(f"the artifact was fit from checkpoint {enc.get('checkpoint')!r}, not pretrained "
                                 f"tag {args.pretrained!r}; pass --checkpoint FILE")
            if not args.checkpoint:
                raise options_error(f"the artifact was fit from checkpoint {enc.get('checkpoint')!r}; pass it with "
                                 "--checkpoint FILE")
            sha = file_sha256(args.checkpoint)
            if sha != enc["checkpoint_sha256"]:
                raise SvgenError(f"checkpoint {args.checkpoint} (sha256 {sha[:12]}…) is not the one the artifact was "
                                 f"fit with ({enc.get('checkpoint')}, sha256 {enc['checkpoint_sha256'][:12]}…)")
            pretrained = None
        else:
            if args.checkpoint:
                tag = enc.get("pretrained")
                raise options_error(f"the artifact was fit from {want}" + (f" pretrained {tag!r}" if tag else "")
                                 + ", not from a checkpoint file; drop --checkpoint")
            if args.pretrained and args.pretrained != enc.get("pretrained"):
                raise options_error(f"--pretrained {args.pretrained} does not match the artifact's encoder "
                                 f"({want}, pretrained {enc.get('pretrained')!r})")
            pretrained = enc.get("pretrained")
        if not args.model and not want.startswith(("hf-hub:", "local-dir:")):
            import open_clip

            if want not in open_clip.list_models():
                raise options_error(f"the artifact's encoder {want!r} is not a built-in open_clip architecture; "
                                 "pass --model with its model-config .json")
        edim = enc.get("embed_dim")
        if edim is not None and int(edim) != dim:
            raise SvgenError(f"the artifact records embed_dim {edim} but its tensors have dimension {dim}")
    quick_gelu = args.quick_gelu
    recorded = enc.get("quick_gelu")
    if recorded is not None:
        if quick_gelu is not None and quick_gelu != bool(recorded):
            raise SvgenError(f"{activation_flag(quick_gelu)} contradicts the artifact, whose encoder was built with "
                             f"{activation_name(bool(recorded))}; images must be embedded the way its prompts were")
        if not pretrained:  # a tag decides its own activation; a mismatch is refused just below
            quick_gelu = bool(recorded)
    with timed(log, f"encoder {model} loaded"):
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
