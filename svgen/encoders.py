"""A frozen open_clip model as a text and image encoder.

Four ways to name the weights, as open_clip does:

* ``ClipEncoder("ViT-B-32", pretrained="openai")``: a built-in architecture and a pretrained
  tag (downloaded once into the usual open_clip / Hugging Face cache);
* ``ClipEncoder("hf-hub:ORG/REPO")``: config and weights from the Hugging Face Hub;
* ``ClipEncoder("local-dir:PATH")``: a folder with ``open_clip_config.json`` and weights;
* ``ClipEncoder("ViT-B-32", checkpoint="FILE")``: an architecture plus a local checkpoint
  (safetensors, or a torch file read with ``weights_only=True``). The architecture may also be
  the path of an open_clip model-config JSON file (a custom architecture, registered by stem).

When weights are not local and the hub cannot be reached, :class:`EncoderUnavailableError` is
raised within seconds (a short reachability probe instead of a minute of retries).

The MLP activation (GELU or QuickGELU) is decided once, before the model is built, and recorded
in :meth:`ClipEncoder.identity` as ``quick_gelu``. OpenAI's weights (and LAION-400M's, MetaCLIP's…)
were trained with QuickGELU, but open_clip 3.x builds ``ViT-B-32`` with GELU whatever the tag,
and GELU embeddings of those weights are several percent off. The rule (:func:`decide_quick_gelu`):

* a pretrained tag: the activation its pretrained config names, whatever the model name; an
  override that contradicts it is refused;
* ``hf-hub:`` / ``local-dir:``: their ``open_clip_config.json`` (an explicit override wins);
* a checkpoint or a bare architecture: the override, else the config's ``quick_gelu``, else a
  ``-quickgelu`` model name, else GELU — with a one-line warning (once per architecture) when
  a checkpoint is loaded into an architecture that has a ``-quickgelu`` variant.

Text encoding truncates each batch to its longest tokenised prompt. CLIP's text tower is causal
and pools the end-of-text token, so positions after it never influence the result: the output
equals stock ``encode_text`` (to float rounding) at a fraction of the cost. Models where that
does not hold (a non-causal mask, last-token pooling, HF text towers) use stock ``encode_text``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pickle
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from .safeio import check_regular, os_error
from .errors import EncoderUnavailableError, SvgenError
from .hub import check_weights_reachable, unavailable

log = logging.getLogger(__name__)

QUICKGELU_SUFFIX = "-quickgelu"
_warned_bare_checkpoint: set = set()  # architectures already warned about (the warning is given once)

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".ppm", ".pgm"}


def file_sha256(path, chunk: int = 1 << 20) -> str:
    """Hex sha256 of a file's bytes (identifies a checkpoint in caches and artifacts).

    Memoised on (real path, size, modification time): a command that checks the prompt cache
    and then loads the model hashes a 600 MB checkpoint once.
    """
    st = check_regular(path, "weights file")
    try:
        return _sha256_of(os.path.realpath(path), st.st_size, st.st_mtime_ns, chunk)
    except OSError as e:
        raise os_error(e, f"cannot read weights file {path}") from None


@functools.lru_cache(maxsize=16)
def _sha256_of(path: str, size: int, mtime_ns: int, chunk: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def identity_key(identity: dict) -> str:
    """A short stable hash of an encoder identity (model, pretrained tag, checkpoint sha256, activation).

    ``quick_gelu`` joins the hash only when it is known, so prompt caches written before svgen
    recorded the activation are not reused by an encoder whose activation may differ.
    """
    text = f"{identity.get('model')}|{identity.get('pretrained')}|{identity.get('checkpoint_sha256')}"
    if identity.get("quick_gelu") is not None:
        text += f"|quick_gelu={bool(identity['quick_gelu'])}"
    return hashlib.sha256(text.encode()).hexdigest()[:20]


# ----------------------------------------------------------------------------- activation

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
    with the other activation (see :mod:`svgen.check`).
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


def check_artifact_activation(recorded: dict, encoder: "ClipEncoder") -> None:
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


def resolve_device(device: Optional[str]) -> torch.device:
    """``None``/``"auto"`` picks CUDA when present; an unavailable CUDA request is a clear error."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SvgenError("--device cuda was requested but no CUDA device is available; use --device cpu")
    return dev


# ----------------------------------------------------------------------------- text encoding

def _truncation_exact(model) -> bool:
    """Whether truncating tokens after the end-of-text token leaves ``encode_text`` unchanged."""
    import open_clip

    if not isinstance(model, open_clip.CLIP) or getattr(model, "cls_emb", None) is not None:
        return False
    if getattr(model, "text_pool_type", None) not in ("argmax", "eos"):
        return False
    mask = getattr(model, "attn_mask", None)
    if mask is None or mask.dim() != 2:
        return False
    n = mask.shape[0]
    causal = torch.triu(torch.ones(n, n, dtype=torch.bool, device=mask.device), diagonal=1)
    return bool(torch.equal(torch.isinf(mask) & (mask < 0), causal)) and bool((mask[~causal] == 0).all())


def _pool_positions(model, tokens: torch.Tensor) -> torch.Tensor:
    if model.text_pool_type == "argmax":
        return tokens.argmax(dim=-1)
    return (tokens == model.text_eos_id).int().argmax(dim=-1)


def encode_text_truncated(model, tokens: torch.Tensor) -> torch.Tensor:
    """``model.encode_text(tokens)`` computed on tokens cut after the last pooled position.

    Exact for causal text towers that pool the end-of-text token (see module docstring).
    """
    length = int(_pool_positions(model, tokens).max()) + 1
    tokens = tokens[:, :length]
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype)
    x = x + model.positional_embedding[:length].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:length, :length])
    x = model.ln_final(x)
    x = x[torch.arange(x.shape[0], device=x.device), _pool_positions(model, tokens)]
    if model.text_projection is not None:
        x = model.text_projection(x) if isinstance(model.text_projection, torch.nn.Linear) else x @ model.text_projection
    return x


# ----------------------------------------------------------------------------- image loading

class _ImageFiles(torch.utils.data.Dataset):
    def __init__(self, paths: Sequence[str], preprocess):
        self.paths = list(paths)
        self.preprocess = preprocess

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        x, reason = load_image(self.paths[i], self.preprocess)
        return i, x, reason


def load_image(source, preprocess) -> Tuple[Optional[torch.Tensor], str]:
    """``(preprocess(RGB image), "")`` for a path or binary file object, or ``(None, reason)``.

    The one place images are decoded: ``svgen classify`` in one process and its Ray engine's
    decoding tasks both call it, so both see the same pixels.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(source) as im:
            im.load()
            return preprocess(im.convert("RGB")), ""
    except Exception as e:  # any one bad file (truncated, not an image, decompression bomb) is skipped
        reason = "not an image" if isinstance(e, UnidentifiedImageError) else (str(e).splitlines() or ["unreadable"])[0]
        return None, reason or type(e).__name__


def _collate(batch):
    ok = [(i, x) for i, x, _ in batch if x is not None]
    bad = [(i, why) for i, x, why in batch if x is None]
    images = torch.stack([x for _, x in ok]) if ok else None
    return [i for i, _ in ok], images, bad


def find_images(inputs: Sequence[str]) -> List[str]:
    """Expand files and folders (searched recursively, sorted) into a list of candidate image paths.

    Files named explicitly are kept whatever their suffix (they are checked when read); inside
    folders only files with an image suffix are taken.
    """
    paths: List[str] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(str(f) for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_SUFFIXES)
            paths.extend(found)
        elif p.is_file():
            paths.append(str(p))
        else:
            raise SvgenError(f"no such file or folder: {item}")
    return paths


# ----------------------------------------------------------------------------- the encoder

def _local_dir_weights(folder: Path) -> Optional[str]:
    """The weights file open_clip picks in a ``local-dir:`` folder, or ``None`` if there is none."""
    try:
        from open_clip.factory import _find_checkpoint_in_dir

        return _find_checkpoint_in_dir(Path(folder))
    except ImportError:  # pragma: no cover - older/newer open_clip: same preference order by hand
        for name in ("open_clip_model.safetensors", "open_clip_pytorch_model.safetensors",
                     "open_clip_pytorch_model.bin", "open_clip_pytorch_model.pth"):
            if (Path(folder) / name).is_file():
                return str(Path(folder) / name)
        found = sorted(p for ext in ("*.safetensors", "*.bin", "*.pth") for p in Path(folder).glob(ext))
        return str(found[0]) if found else None


def _hf_hub_weights_sha256(model: str) -> Optional[str]:
    """sha256 of the weights file open_clip loaded for ``hf-hub:ORG/REPO`` (resolved from the local
    cache the way open_clip resolves it), so artifacts can check that the same weights embed images."""
    from open_clip.pretrained import download_pretrained_from_hf

    try:
        return file_sha256(download_pretrained_from_hf(model[len("hf-hub:"):]))
    except Exception as e:  # the model loaded, so this only fails if the cache changed underneath: not fatal
        log.warning("could not hash the weights of %s (%s)", model, (str(e).splitlines() or [""])[0][:200])
        return None


def encoder_identity(model: str, pretrained: Optional[str] = None, checkpoint: Optional[str] = None,
                     quick_gelu: Optional[bool] = None) -> Optional[Dict[str, object]]:
    """What ``ClipEncoder(model, pretrained, checkpoint, quick_gelu=…).identity()`` will be, without
    building the model.

    Lets a command look its prompts up in the cache (and compare against an artifact's encoder)
    before paying for a model load. ``None`` when it cannot be known without loading (a named file
    is missing, or an ``hf-hub:`` model decides its activation in a config that is not read here):
    the caller then builds the :class:`ClipEncoder`, which reports problems in its own words. The
    activation is :func:`decide_quick_gelu`'s decision; a model whose towers have no open_clip MLPs
    records ``None`` once built, so its key differs and the cache is simply not used.
    """
    name, sha = model, None
    if model.startswith("hf-hub:"):  # its weights' sha256 is known once open_clip has resolved them
        return None
    if model.endswith(".json"):
        if not os.path.isfile(model):
            return None
        import open_clip

        open_clip.add_model_config(model)  # as ClipEncoder does: the decision reads the registered config
        name = Path(model).stem
    elif model.startswith("local-dir:"):
        folder = Path(model[len("local-dir:"):])
        weights = _local_dir_weights(folder) if (folder / "open_clip_config.json").is_file() else None
        if weights is None:
            return None
        sha = file_sha256(weights)
    if checkpoint:
        if not os.path.isfile(checkpoint):
            return None
        sha = file_sha256(checkpoint)
    act, _ = decide_quick_gelu(name, pretrained, checkpoint, quick_gelu)
    if act is None and name.startswith("local-dir:"):
        try:
            cfg = json.loads((Path(name[len("local-dir:"):]) / "open_clip_config.json").read_text(encoding="utf-8"))
            act = bool((cfg.get("model_cfg") or {}).get("quick_gelu", False))
        except (OSError, ValueError, AttributeError):
            return None
    if act is None:
        return None
    return {"model": name, "pretrained": pretrained,
            "checkpoint": os.path.basename(str(checkpoint)) if checkpoint else None, "checkpoint_sha256": sha,
            "quick_gelu": act}


class ClipEncoder:
    """A frozen open_clip model in inference mode, with batched text and image encoding."""

    def __init__(
        self,
        model: str = "ViT-B-32",
        pretrained: Optional[str] = None,
        checkpoint: Optional[str] = None,
        device: Optional[str] = "cpu",
        quick_gelu: Optional[bool] = None,
    ):
        import open_clip

        if pretrained and checkpoint:
            raise SvgenError("give either --pretrained TAG or --checkpoint FILE, not both")
        self.model_name = model
        self.pretrained = pretrained
        self.checkpoint = str(checkpoint) if checkpoint else None
        self.device = resolve_device(device)
        self.checkpoint_sha256 = None

        if model.endswith(".json") and os.path.isfile(model):
            # A custom architecture: an open_clip model config file, registered under its stem.
            open_clip.add_model_config(model)
            model = self.model_name = Path(model).stem
        if model.startswith("local-dir:"):
            folder = Path(model[len("local-dir:"):])
            if not (folder / "open_clip_config.json").is_file():
                raise SvgenError(f"local-dir:{folder} must be a folder holding open_clip_config.json and weights")
            weights = _local_dir_weights(folder)
            if weights is None:  # open_clip would only warn and go on with random weights
                raise SvgenError(f"local-dir:{folder} holds no weights (*.safetensors, *.bin or *.pth) "
                                 "beside open_clip_config.json")
            self.checkpoint_sha256 = file_sha256(weights)  # the cache key follows the weights, not the path
        elif not model.startswith("hf-hub:") and model not in open_clip.list_models():
            raise SvgenError(f"unknown open_clip model {model!r}; see open_clip.list_models() for built-in names")
        if self.checkpoint:
            check_regular(self.checkpoint, "checkpoint file")  # missing, unreadable or not a file: one line each
            self.checkpoint_sha256 = file_sha256(self.checkpoint)
        elif pretrained and not model.startswith(("hf-hub:", "local-dir:")) and not open_clip.get_pretrained_cfg(model, pretrained):
            tags = [t for m, t in open_clip.list_pretrained() if m == model]
            raise SvgenError(f"unknown pretrained tag {pretrained!r} for {model}; known tags: {', '.join(tags) or 'none'}")
        want, self.quick_gelu_reason = decide_quick_gelu(model, pretrained, self.checkpoint, quick_gelu)
        check_weights_reachable(model, pretrained)

        act = {} if want is None else {"quick_gelu": want, "force_quick_gelu": want}
        try:
            with warnings.catch_warnings():
                # open_clip compares the tag's activation with its config *before* our override is
                # applied; the activation actually built is checked against the decision below.
                warnings.filterwarnings("ignore", message="QuickGELU mismatch", category=UserWarning)
                self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                    model, pretrained=self.checkpoint or pretrained, device=self.device, **act
                )
            self.tokenizer = open_clip.get_tokenizer(model)
        except EncoderUnavailableError:
            raise
        except RuntimeError as e:
            if "size mismatch" in str(e) or "Missing key" in str(e) or "Unexpected key" in str(e):
                raise SvgenError(f"checkpoint {self.checkpoint or pretrained} does not match architecture {model}") from None
            what = self.checkpoint or (f"{model} weights '{pretrained}'" if pretrained else model)
            raise unavailable(what, (str(e).splitlines() or ["load failed"])[0][:200], model, pretrained) from None
        except (OSError, ValueError) as e:
            raise SvgenError(f"cannot load {self.checkpoint or model}: {(str(e).splitlines() or [''])[0][:200]}") from None
        except pickle.UnpicklingError:
            raise SvgenError(f"cannot load {self.checkpoint or model}: torch.load(weights_only=True) refused it "
                             "(not a torch file, or it holds pickled objects besides tensors); "
                             "convert it to .safetensors") from None
        except Exception as e:  # e.g. safetensors' own error for a damaged file: still one line, no traceback
            first = (str(e).splitlines() or [""])[0][:200]
            raise SvgenError(f"cannot load {self.checkpoint or model}: {type(e).__name__}: {first}") from None
        self.model.eval().requires_grad_(False)
        if model.startswith("hf-hub:"):
            self.checkpoint_sha256 = _hf_hub_weights_sha256(model)
        self.quick_gelu = built_quick_gelu(self.model)
        if want is not None and self.quick_gelu is not None and self.quick_gelu != want:  # pragma: no cover
            raise SvgenError(f"asked open_clip for {activation_name(want)} ({self.quick_gelu_reason}) "
                             f"but it built {activation_name(self.quick_gelu)}")
        log.info("%s: %s (%s)", self.model_name, activation_name(self.quick_gelu), self.quick_gelu_reason)
        self.truncate_text = _truncation_exact(self.model)
        if not self.truncate_text:
            log.info("text tower is not causal/EOT-pooled; using stock encode_text")

    @classmethod
    def from_model(cls, model, tokenizer, preprocess=None, name: str = "custom", device: Optional[str] = None):
        """Wrap an open_clip model that is already built (e.g. ``open_clip.create_model(...)``).

        No weights are loaded or checked; the identity is ``name`` alone, so give each distinct set of
        weights its own name if the prompt cache is used.
        """
        self = cls.__new__(cls)
        self.model_name, self.pretrained, self.checkpoint, self.checkpoint_sha256 = name, None, None, None
        self.device = resolve_device(device) if device else next(model.parameters()).device
        self.model = model.to(self.device).eval().requires_grad_(False)
        self.tokenizer, self.preprocess = tokenizer, preprocess
        self.quick_gelu, self.quick_gelu_reason = built_quick_gelu(self.model), "the model given"
        self.truncate_text = _truncation_exact(self.model)
        return self

    # identity -------------------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        with torch.inference_mode():
            return int(self.encode_text(["a"]).shape[-1])

    @property
    def context_length(self) -> int:
        return int(getattr(self.tokenizer, "context_length", 77))

    def identity(self) -> Dict[str, object]:
        """What produced the embeddings: recorded in artifacts and used as the cache key.

        ``quick_gelu`` is the MLP activation actually built (``None`` for towers without open_clip
        transformer MLPs). Artifacts from before it was recorded lack the key: see
        :func:`check_artifact_activation`.
        """
        return {
            "model": self.model_name,
            "pretrained": self.pretrained,
            "checkpoint": os.path.basename(self.checkpoint) if self.checkpoint else None,
            "checkpoint_sha256": self.checkpoint_sha256,
            "quick_gelu": self.quick_gelu,
        }

    def identity_key(self) -> str:
        """A short stable hash of :meth:`identity` minus the checkpoint's file name."""
        return identity_key(self.identity())

    # text -----------------------------------------------------------------------------------
    def too_long(self, prompts: Sequence[str]) -> List[str]:
        """Prompts whose tokens exceed the context length (they get truncated by the tokenizer)."""
        out = []
        for p in prompts:
            ids = self.tokenizer.encode(p) if hasattr(self.tokenizer, "encode") else None
            if ids is not None and len(ids) + 2 > self.context_length:
                out.append(p)
        return out

    @torch.inference_mode()
    def encode_text(self, prompts: Sequence[str], batch_size: int = 256, progress: bool = False) -> torch.Tensor:
        """Raw (unnormalised) text embeddings, N×D float32 on the CPU, in the order given.

        Prompts are sorted by token length so each batch is truncated as tightly as possible.
        """
        if len(prompts) == 0:
            return torch.zeros(0, 0)
        tokens = self.tokenizer(list(prompts))
        lengths = _pool_positions(self.model, tokens) if self.truncate_text else torch.zeros(len(prompts))
        order = torch.argsort(lengths, stable=True)
        out = [None] * len(prompts)
        starts = range(0, len(prompts), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encoding prompts", unit="batch", leave=False)
        for s in starts:
            idx = order[s:s + batch_size]
            batch = tokens[idx].to(self.device)
            feats = encode_text_truncated(self.model, batch) if self.truncate_text else self.model.encode_text(batch)
            for i, f in zip(idx.tolist(), feats.float().cpu()):
                out[i] = f
        return torch.stack(out)

    # images ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_batch(self, images: torch.Tensor) -> torch.Tensor:
        """Raw image embeddings (float32, CPU) of a batch of preprocessed images."""
        return self.model.encode_image(images.to(self.device)).float().cpu()

    @torch.inference_mode()
    def encode_images(
        self,
        paths: Sequence[str],
        batch_size: int = 32,
        num_workers: Optional[int] = None,
        progress: bool = False,
    ) -> Tuple[torch.Tensor, List[str], List[Tuple[str, str]]]:
        """Encode image files; returns (N_ok×D raw features, ok paths, [(failed path, reason)]).

        Unreadable and non-image files are skipped and reported, never fatal.
        """
        paths = list(paths)
        if num_workers is None:
            num_workers = 0 if len(paths) <= 2 * batch_size else min(4, os.cpu_count() or 1)
        loader = torch.utils.data.DataLoader(
            _ImageFiles(paths, self.preprocess), batch_size=batch_size, num_workers=num_workers,
            collate_fn=_collate, shuffle=False,
        )
        feats, ok, failed = [], [], []
        it = loader
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(loader, desc="encoding images", unit="batch", leave=False)
        for idx, images, bad in it:
            failed.extend((paths[i], why) for i, why in bad)
            if images is None:
                continue
            feats.append(self.encode_batch(images))
            ok.extend(paths[i] for i in idx)
        for p, why in failed:
            log.info("skipped %s: %s", p, why)  # returned in `failed`; the caller reports them
        dim = feats[0].shape[1] if feats else 0
        return (torch.cat(feats) if feats else torch.zeros(0, dim)), ok, failed


def as_numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
