"""Is my encoder right? Compare an encoder's embeddings with a model's published reference outputs.

A :class:`Reference` is a few texts and one image with the embeddings the real model gives them
(raw rows: texts first, then the image) and the image preprocessing that model uses. svgen ships
one: OpenAI CLIP ViT-B/32 on "a diagram", "a dog", "a cat" and ``CLIP.png``
(:func:`shipped_reference`; ``svgen/encoders/reference/README.md`` says where the numbers come from).

:func:`check_encoder` encodes the same inputs through the encoder's own code path and reports
the cosine of each row with the reference. Every cosine ≥ ``threshold`` (0.999) passes. When
something fails it re-encodes to say which mistake is likely:

* the texts fail too (the texts go through no preprocessing, so the weights or the activation
  are wrong): the same weights with the other MLP activation (GELU ↔ QuickGELU, swapped in place);
  passing then means a GELU/QuickGELU mix-up;
* only the image fails: the image again with the reference's preprocessing; passing then means
  wrong preprocessing;
* neither repair passes (both together are tried too): the weights are not the reference model's.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

from svgen.encoders.activation import activation_flag, activation_name, swapped_activation
from svgen.errors import SvgenError

log = logging.getLogger(__name__)

THRESHOLD = 0.999
REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
OPENAI_ARCHITECTURE = "ViT-B-32"


@dataclass
class Reference:
    """Reference embeddings: ``embeddings`` rows are ``texts`` then ``image`` (raw or normalised, any scale)."""

    name: str
    texts: List[str]
    image: str
    embeddings: np.ndarray
    preprocess: Dict[str, object]  # image_size, mean, std, interpolation, resize_mode (open_clip.image_transform)
    source: str = ""

    def __post_init__(self):
        self.embeddings = np.asarray(self.embeddings, dtype=np.float32)
        if self.embeddings.ndim != 2 or self.embeddings.shape[0] != len(self.texts) + 1:
            raise SvgenError(f"reference {self.name}: embeddings have shape {self.embeddings.shape}; expected "
                             f"({len(self.texts) + 1}, D): one row per text, then the image")

    @property
    def labels(self) -> List[str]:
        return [f'text "{t}"' for t in self.texts] + [f"image {Path(self.image).name}"]

    def transform(self):
        """The reference model's image preprocessing as an open_clip transform."""
        import open_clip

        cfg = dict(self.preprocess)
        return open_clip.image_transform(cfg.pop("image_size"), is_train=False, **cfg)


def shipped_reference() -> Reference:
    """OpenAI CLIP ViT-B/32's outputs from ``svgen/encoders/reference`` (NumPyCLIP, MIT)."""
    meta = json.loads((REFERENCE_DIR / "reference.json").read_text(encoding="utf-8"))
    emb = np.load(REFERENCE_DIR / meta["embeddings"], allow_pickle=False)
    return Reference(name=meta["name"], texts=meta["texts"], image=str(REFERENCE_DIR / meta["image"]),
                     embeddings=emb, preprocess=meta["preprocess"], source=meta["source"])


def _arch(cfg: Optional[dict]) -> Optional[dict]:
    if not isinstance(cfg, dict):
        return None
    return {k: v for k, v in cfg.items() if k != "quick_gelu"}


def reference_applies(model: str, pretrained: Optional[str]) -> Tuple[bool, str]:
    """Whether the shipped reference describes these weights (True, "") or why not (False, reason).

    A pretrained tag applies only when it is ``openai`` on ViT-B-32's architecture (any name for it,
    ``-quickgelu`` included); other tags are other weights. A checkpoint, ``hf-hub:`` or
    ``local-dir:`` model applies when its architecture is ViT-B-32's (the weights are then taken
    to be meant as OpenAI's; the verdict says if they are not). For ``hf-hub:`` the config must be
    cached, which it is once the encoder loaded.
    """
    import open_clip

    try:
        cfg = open_clip.get_model_config(model)
    except Exception:
        cfg = None
    same_arch = _arch(cfg) is not None and _arch(cfg) == _arch(open_clip.get_model_config(OPENAI_ARCHITECTURE))
    if pretrained:
        if pretrained.lower().replace("-", "_") != "openai" or not same_arch:
            return False, f"{model} pretrained '{pretrained}'"
        return True, ""
    if not same_arch:
        return False, f"{model} (not the ViT-B-32 architecture)"
    return True, ""


@dataclass
class CheckResult:
    """Per-row cosines, the verdict, and what the repairs tried gave (their minimum cosines)."""

    labels: List[str]
    cosines: List[float]
    passed: bool
    verdict: str
    tried: Dict[str, float] = field(default_factory=dict)
    threshold: float = THRESHOLD



def _cosines(a: torch.Tensor, b: np.ndarray) -> List[float]:
    a = torch.nn.functional.normalize(a.float(), dim=-1)
    b = torch.nn.functional.normalize(torch.as_tensor(b, dtype=torch.float32), dim=-1)
    return [float(x) for x in (a * b).sum(-1)]


def _encode(encoder, reference: Reference, preprocess=None) -> torch.Tensor:
    """Texts then the image, through the encoder's own code paths (truncated text encoding, image loader), in
    fp32 whatever the device (the check is of the weights, not of a GPU's mixed precision)."""
    saved, precision = encoder.preprocess, getattr(encoder, "precision", "fp32")
    if preprocess is not None or saved is None:
        encoder.preprocess = preprocess or reference.transform()
    encoder.precision = "fp32"
    try:
        text = encoder.encode_text(reference.texts)
        image, ok, failed = encoder.encode_images([reference.image], num_workers=0)
    finally:
        encoder.preprocess, encoder.precision = saved, precision
    if not ok:
        raise SvgenError(f"cannot read the reference image {reference.image}: {failed[0][1]}")
    return torch.cat([text, image])


def check_encoder(encoder, reference: Reference, threshold: float = THRESHOLD) -> CheckResult:
    """Compare ``encoder``'s embeddings of the reference inputs with the reference (see module docstring)."""
    if encoder.embed_dim != reference.embeddings.shape[1]:
        raise SvgenError(f"the encoder embeds to dimension {encoder.embed_dim} but the {reference.name} reference "
                         f"has {reference.embeddings.shape[1]}: it is another model, nothing to compare")
    ref = reference.embeddings
    n_text = len(reference.texts)
    cos = _cosines(_encode(encoder, reference), ref)
    labels = reference.labels
    if min(cos) >= threshold:
        return CheckResult(labels, cos, True, f"every cosine ≥ {threshold}: the encoder reproduces {reference.name}",
                           threshold=threshold)

    act = encoder.quick_gelu
    tried: Dict[str, float] = {}
    other = None if act is None else not act
    if other is not None:
        with swapped_activation(encoder.model):
            tried[f"with {activation_name(other)}"] = min(_cosines(_encode(encoder, reference), ref))
    tried["with the reference's preprocessing"] = min(_cosines(_encode(encoder, reference, reference.transform()), ref))
    if other is not None:
        with swapped_activation(encoder.model):
            both = _cosines(_encode(encoder, reference, reference.transform()), ref)
        tried[f"with {activation_name(other)} and the reference's preprocessing"] = min(both)

    text_ok = min(cos[:n_text]) >= threshold
    fixed = [how for how, c in tried.items() if c >= threshold]
    swap, prep = f"with {activation_name(other)}", "with the reference's preprocessing"
    if swap in fixed:
        verdict = (f"GELU/QuickGELU mix-up: built with {activation_name(act)}, but the same weights with "
                   f"{activation_name(other)} match (min cosine {tried[swap]:.6f}); pass {activation_flag(other)}")
    elif prep in fixed:  # texts need no preprocessing, so they passed already
        verdict = (f"wrong image preprocessing: the texts match but the image matches only with {reference.name}'s "
                   f"preprocessing ({_describe(reference.preprocess)}; min cosine {tried[prep]:.6f})")
    elif fixed:
        verdict = (f"GELU/QuickGELU mix-up and wrong image preprocessing: only {fixed[0]} does it match; "
                   f"pass {activation_flag(other)} and use {_describe(reference.preprocess)}")
    elif text_ok:
        verdict = (f"the texts match but the image does not, even with {reference.name}'s preprocessing: the "
                   "image tower's weights or the image loading differ")
    else:
        verdict = (f"wrong weights: neither the other activation nor {reference.name}'s preprocessing brings the "
                   f"cosines to {threshold} (the best variant's minimum cosine is {max(tried.values()):.4f}); these are not {reference.name}'s "
                   "weights, or not for this architecture")
    return CheckResult(labels, cos, False, verdict, tried=tried, threshold=threshold)


def _describe(pre: Dict[str, object]) -> str:
    return (f"{pre.get('resize_mode', 'shortest')} resize to {pre.get('image_size')} "
            f"{pre.get('interpolation', 'bicubic')}, mean {tuple(round(v, 3) for v in pre.get('mean', ()))}")
