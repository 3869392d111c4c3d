"""The MLP activation of an open_clip model: GELU or QuickGELU, decided before the model is built.

Decided once, before the model is built, and recorded in
:meth:`svgen.encoders.clip.ClipEncoder.identity` as ``quick_gelu``. OpenAI's weights (and LAION-400M's, MetaCLIP's…)
were trained with QuickGELU, but open_clip 3.x builds ``ViT-B-32`` with GELU whatever the tag,
and GELU embeddings of those weights are several percent off. The rule (:func:`decide_quick_gelu`):

* a pretrained tag: the activation its pretrained config names, whatever the model name; an
  override that contradicts it is refused;
* ``hf-hub:`` / ``local-dir:``: their ``open_clip_config.json`` (an explicit override wins);
* a checkpoint or a bare architecture: the override, else the config's ``quick_gelu``, else a
  ``-quickgelu`` model name, else GELU — with a one-line warning (once per architecture) when
  a checkpoint is loaded into an architecture that has a ``-quickgelu`` variant.
"""

from __future__ import annotations

import logging
import os
from typing import Optional, Tuple

import torch

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

QUICKGELU_SUFFIX = "-quickgelu"
_warned_bare_checkpoint: set = set()  # architectures already warned about (the warning is given once)


def activation_name(quick_gelu: Optional[bool]) -> str:
    return "unknown activation" if quick_gelu is None else ("QuickGELU" if quick_gelu else "GELU")


def activation_flag(quick_gelu: bool) -> str:
    return "--quick-gelu" if quick_gelu else "--no-quick-gelu"


def _mlp_activations(model):
    """(block.mlp, activation module) of every open_clip transformer block's MLP."""
    from open_clip.transformer import QuickGELU

    for module in model.modules():
        mlp = getattr(module, "mlp", None)
        act = getattr(mlp, "gelu", None) if isinstance(mlp, torch.nn.Sequential) else None
        if isinstance(act, (torch.nn.GELU, QuickGELU)):
            yield mlp, act


def built_quick_gelu(model) -> Optional[bool]:
    """Whether the model's transformer MLPs use QuickGELU (``None`` if it has no such MLPs, e.g. timm/HF towers).

    Read from the modules themselves, so it says what was built, not what was asked for.
    """
    from open_clip.transformer import QuickGELU

    kinds = {isinstance(act, QuickGELU) for _, act in _mlp_activations(model)}
    if not kinds:
        return None
    if len(kinds) > 1:  # pragma: no cover - open_clip builds both towers with one act_layer
        raise SvgenError("the model mixes GELU and QuickGELU blocks; svgen cannot say which it is")
    return kinds.pop()


class swapped_activation:
    """Context manager: the model's MLP activations replaced by the other kind (GELU ↔ QuickGELU), in place.

    The weights are untouched, so encoding inside the block shows what the same weights give
    with the other activation (see :mod:`svgen.encoders.check`).
    """

    def __init__(self, model):
        self.model, self.saved = model, []

    def __enter__(self):
        from open_clip.transformer import QuickGELU

        for mlp, act in _mlp_activations(self.model):
            self.saved.append((mlp, act))
            mlp.gelu = torch.nn.GELU() if isinstance(act, QuickGELU) else QuickGELU()
        return self.model

    def __exit__(self, *exc):
        for mlp, act in self.saved:
            mlp.gelu = act
        self.saved = []
        return False


def config_quick_gelu(model: str) -> Optional[bool]:
    """The ``quick_gelu`` key of an open_clip model config (built-in, registered, hf-hub or local-dir), if set."""
    import open_clip

    try:
        cfg = open_clip.get_model_config(model)
    except Exception:  # an hf-hub config that is not cached, a broken local-dir config: not known
        return None
    if not isinstance(cfg, dict) or "quick_gelu" not in cfg:
        return None
    return bool(cfg["quick_gelu"])


def decide_quick_gelu(model: str, pretrained: Optional[str] = None, checkpoint: Optional[str] = None,
                      quick_gelu: Optional[bool] = None) -> Tuple[Optional[bool], str]:
    """(QuickGELU or not — ``None``: what the config says — and why), before anything is built.

    ``model`` is an open_clip name (built-in, registered model config, ``hf-hub:``/``local-dir:``);
    ``quick_gelu`` is the caller's override (``--quick-gelu``/``--no-quick-gelu``) or ``None``.
    """
    import open_clip

    if model.startswith(("hf-hub:", "local-dir:")):
        if quick_gelu is not None:
            return quick_gelu, "requested"
        return None, "its open_clip_config.json"
    if pretrained and not checkpoint:
        tag_cfg = open_clip.get_pretrained_cfg(model, pretrained)
        if tag_cfg:
            tag = bool(tag_cfg.get("quick_gelu", False))
            if quick_gelu is not None and quick_gelu != tag:
                raise SvgenError(f"{model} weights '{pretrained}' were trained with {activation_name(tag)}; "
                                 f"{activation_flag(quick_gelu)} would give wrong embeddings (drop it)")
            return tag, f"pretrained tag '{pretrained}'"
    if quick_gelu is not None:
        return quick_gelu, "requested"
    cfg = config_quick_gelu(model)
    if cfg is not None:
        return cfg, f"{model}'s model config"
    if model.endswith(QUICKGELU_SUFFIX):
        return True, f"the model name {model}"
    variant = model + QUICKGELU_SUFFIX
    if checkpoint and variant in open_clip.list_models() and model not in _warned_bare_checkpoint:
        _warned_bare_checkpoint.add(model)
        log.warning("%s is loaded into %s with GELU, its config's default; OpenAI CLIP, LAION-400M and MetaCLIP "
                    "weights need QuickGELU: pass --quick-gelu (or --model %s) for those, --no-quick-gelu to "
                    "keep GELU and silence this", os.path.basename(checkpoint), model, variant)
    return False, "open_clip's default"


def legacy_quick_gelu(model: str) -> bool:
    """What svgen built before it decided the activation: open_clip 3.x's default for the model's config."""
    return bool(config_quick_gelu(model))


def check_artifact_activation(recorded: dict, encoder) -> None:
    """Refuse (one line) an encoder whose activation differs from the one an artifact records.

    Artifacts written before svgen recorded ``quick_gelu`` have none: their prompts were encoded
    with open_clip's default for the model (:func:`legacy_quick_gelu`); when the encoder now
    differs from that, a warning says to refit instead of a refusal, so old artifacts keep working.
    """
    want = recorded.get("quick_gelu")
    got = encoder.quick_gelu
    if got is None:
        return
    if want is not None:
        if bool(want) != got:
            raise SvgenError(f"the artifact's encoder was built with {activation_name(bool(want))} but this one "
                             f"with {activation_name(got)}; images must be embedded the way its prompts were "
                             f"(pass {activation_flag(bool(want))}, or refit)")
        return
    old = legacy_quick_gelu(encoder.model_name)
    if old != got:
        log.warning("the artifact records no activation (fit by an older svgen): its prompts were most likely "
                    "encoded with %s, but %s needs %s (%s); refit it so prompts and images match",
                    activation_name(old), encoder.model_name, activation_name(got), encoder.quick_gelu_reason)


