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

The MLP activation (GELU or QuickGELU) is decided once, before the model is built (:mod:`svgen.encoders.activation`),
and recorded in :meth:`ClipEncoder.identity` as ``quick_gelu``. Weights' identity and sha256:
:mod:`svgen.encoders.identity`; image files: :mod:`svgen.encoders.images`.

Text encoding truncates each batch to its longest tokenised prompt. CLIP's text tower is causal
and pools the end-of-text token, so positions after it never influence the result: the output
equals stock ``encode_text`` (to float rounding) at a fraction of the cost. Models where that
does not hold (a non-causal mask, last-token pooling, HF text towers) use stock ``encode_text``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import time
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from svgen.safeio import check_regular
from svgen.errors import EncoderUnavailableError, SvgenError
from svgen.encoders.activation import activation_name, built_quick_gelu, decide_quick_gelu
from svgen.encoders.hub import check_weights_reachable, unavailable
from svgen.encoders.identity import hf_hub_weights_sha256, local_dir_weights, file_sha256, identity_key
from svgen.encoders.images import ImageFiles, collate
from svgen.encoders.install import import_open_clip
from svgen.encoders.runtime import (autocast, autocast_dtype, device_name, plan_loader, precision_label,
                                    resolve_device, text_batch_size)
from svgen.encoders.tokens import token_ids, tokenize
from svgen.encoders.tensor_decode import JpegBytes, TensorPreprocess, collate_bytes, decode_batches

log = logging.getLogger(__name__)


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

# ----------------------------------------------------------------------------- the encoder

class _NoTagNotice(logging.Filter):
    def filter(self, record):
        return not record.getMessage().startswith("No pretrained weights loaded")


@contextlib.contextmanager
def quiet_about_tags(checkpoint: bool):
    """While open_clip builds a model from a ``checkpoint`` file: without its root-logger warning "No pretrained
    weights loaded for model … Model initialized randomly", which speaks of pretrained *tags* and reads as if the
    checkpoint were ignored (open_clip loads a checkpoint strictly or raises; svgen logs the file it loaded)."""
    if not checkpoint:
        yield
        return
    notice, root = _NoTagNotice(), logging.getLogger()
    root.addFilter(notice)
    try:
        yield
    finally:
        root.removeFilter(notice)


class ClipEncoder:
    """A frozen open_clip model in inference mode, with batched text and image encoding."""

    def __init__(
        self,
        model: str = "ViT-B-32",
        pretrained: Optional[str] = None,
        checkpoint: Optional[str] = None,
        device: Optional[str] = "auto",
        quick_gelu: Optional[bool] = None,
        precision: str = "auto",
    ):
        open_clip = import_open_clip()   # a torch/torchvision pair that does not match: one line

        if pretrained and checkpoint:
            raise SvgenError("give either pretrained=TAG or checkpoint=FILE, not both",
                             cli="give either --pretrained TAG or --checkpoint FILE, not both")
        self.model_name = model
        self.pretrained = pretrained
        self.checkpoint = str(checkpoint) if checkpoint else None
        self.device = resolve_device(device)
        self.precision = precision
        self.autocast_dtype  # checks the name before any work
        self.checkpoint_sha256 = None

        if model.endswith(".json") and os.path.isfile(model):
            # A custom architecture: an open_clip model config file, registered under its stem.
            open_clip.add_model_config(model)
            model = self.model_name = Path(model).stem
        if model.startswith("local-dir:"):
            folder = Path(model[len("local-dir:"):])
            if not (folder / "open_clip_config.json").is_file():
                raise SvgenError(f"local-dir:{folder} must be a folder holding open_clip_config.json and weights")
            weights = local_dir_weights(folder)
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
            with warnings.catch_warnings(), quiet_about_tags(bool(self.checkpoint)):
                # open_clip compares the tag's activation with its config *before* our override is
                # applied; the activation actually built is checked against the decision below.
                warnings.filterwarnings("ignore", message="QuickGELU mismatch", category=UserWarning)
                self.model, _, self.preprocess = open_clip.create_model_and_transforms(
                    model, pretrained=self.checkpoint or pretrained, device=self.device, **act
                )
            if self.checkpoint:
                log.info("weights: %s (sha256 %s…)", self.checkpoint, self.checkpoint_sha256[:12])
            self._tokenizer_name = model
            text_cfg = (open_clip.get_model_config(model) or {}).get("text_cfg") or {}
            if model.startswith(("hf-hub:", "local-dir:")) or text_cfg.get("hf_tokenizer_name"):
                self.tokenizer = open_clip.get_tokenizer(model)   # may read files or the hub: failures said here
            else:
                self.tokenizer = None   # open_clip's BPE tokenizer: built on first use (`classify` never needs it)
        except EncoderUnavailableError:
            raise
        except RuntimeError as e:
            if "size mismatch" in str(e) or "Missing key" in str(e) or "Unexpected key" in str(e):
                raise SvgenError(f"checkpoint {self.checkpoint or pretrained} does not match architecture {model}") from None
            why = (str(e).splitlines() or ["load failed"])[0][:200]
            if self.checkpoint:   # local weights were passed: advice to pass local weights would mislead
                raise SvgenError(f"cannot load checkpoint {self.checkpoint} on {self.device}: {why}") from None
            what = f"{model} weights '{pretrained}'" if pretrained else model
            raise unavailable(what, why, model, pretrained) from None
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
            self.checkpoint_sha256 = hf_hub_weights_sha256(model)
        self.quick_gelu = built_quick_gelu(self.model)
        if want is not None and self.quick_gelu is not None and self.quick_gelu != want:  # pragma: no cover
            raise SvgenError(f"asked open_clip for {activation_name(want)} ({self.quick_gelu_reason}) "
                             f"but it built {activation_name(self.quick_gelu)}")
        log.info("%s: %s (%s)", self.model_name, activation_name(self.quick_gelu), self.quick_gelu_reason)
        log.info("encoder device: %s (--device %s), %s", device_name(self.device), device or "auto", self.precision_name)
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
        self.precision = "auto"
        self.tokenizer, self.preprocess = tokenizer, preprocess
        self.quick_gelu, self.quick_gelu_reason = built_quick_gelu(self.model), "the model given"
        self.truncate_text = _truncation_exact(self.model)
        return self

    # how it runs ---------------------------------------------------------------------------
    @property
    def autocast_dtype(self) -> Optional[torch.dtype]:
        """Mixed precision's dtype on this device (``None``: fp32); :func:`svgen.encoders.runtime.autocast_dtype`."""
        return autocast_dtype(self.device, self.precision)

    @property
    def precision_name(self) -> str:
        return precision_label(self.autocast_dtype)

    @property
    def tokenizer(self):
        """The model's tokenizer (open_clip's BPE tokenizer is built when first used: half a second)."""
        tok = self.__dict__.get("_tokenizer")
        if tok is None and self.__dict__.get("_tokenizer_name"):
            import open_clip

            tok = self.__dict__["_tokenizer"] = open_clip.get_tokenizer(self._tokenizer_name)
        return tok

    @tokenizer.setter
    def tokenizer(self, value):
        self.__dict__["_tokenizer"] = value

    # identity -------------------------------------------------------------------------------
    @property
    def embed_dim(self) -> int:
        out = getattr(getattr(self.model, "visual", None), "output_dim", None)
        if isinstance(out, int):   # the image tower's projection: the shared embedding space
            return out
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
        ids = self._token_ids(prompts)
        if ids is None and hasattr(self.tokenizer, "encode"):
            ids = [self.tokenizer.encode(p) for p in prompts]
        return [p for p, t in zip(prompts, ids or ()) if len(t) + 2 > self.context_length]

    def _token_ids(self, prompts: Sequence[str]) -> Optional[List[List[int]]]:
        return token_ids(self.tokenizer, prompts, self.__dict__.setdefault("_ids_memo", {}))

    def tokenize(self, prompts: Sequence[str]) -> torch.Tensor:
        """``tokenizer(prompts)``; each prompt's BPE ids are computed once (:func:`svgen.encoders.tokens.tokenize`)."""
        return tokenize(self.tokenizer, prompts, self.__dict__.setdefault("_ids_memo", {}))

    @torch.inference_mode()
    def encode_text(self, prompts: Sequence[str], batch_size: Optional[int] = None,
                    progress: bool = False) -> torch.Tensor:
        """Raw (unnormalised) text embeddings, N×D float32 on the CPU, in the order given.

        Identical prompts are encoded once. Prompts are sorted by token length so each batch is truncated
        as tightly as possible; ``batch_size`` defaults to the device's (:func:`svgen.encoders.runtime.text_batch_size`);
        on a GPU the tower runs in mixed precision (:attr:`autocast_dtype`).
        """
        if len(prompts) == 0:
            return torch.zeros(0, 0)
        unique = list(dict.fromkeys(prompts))
        batch_size = batch_size or text_batch_size(self.device)
        tokens = self.tokenize(unique)
        self.__dict__.pop("_ids_memo", None)   # encoded: the ids are not needed again
        lengths = _pool_positions(self.model, tokens) if self.truncate_text else torch.zeros(len(unique))
        order = torch.argsort(lengths, stable=True)
        parts = []
        starts = range(0, len(unique), batch_size)
        if progress:
            from tqdm.auto import tqdm

            starts = tqdm(starts, desc="encoding prompts", unit="batch", leave=False)
        for s in starts:
            batch = tokens[order[s:s + batch_size]].to(self.device, non_blocking=True)
            with autocast(self.device, self.autocast_dtype):
                feats = encode_text_truncated(self.model, batch) if self.truncate_text else self.model.encode_text(batch)
            parts.append(feats.float())
        out = torch.empty(len(unique), parts[0].shape[-1])
        out[order] = torch.cat(parts).cpu()
        if len(unique) == len(prompts):
            return out
        row = {p: i for i, p in enumerate(unique)}
        return out[torch.tensor([row[p] for p in prompts])]

    # images ---------------------------------------------------------------------------------
    def _encode_on_device(self, images: torch.Tensor) -> torch.Tensor:
        """Raw float32 embeddings, left on the device (copying them back would wait for the device)."""
        images = images.to(self.device, non_blocking=True)
        with autocast(self.device, self.autocast_dtype):
            return self.model.encode_image(images).float()

    @torch.inference_mode()
    def encode_batch(self, images: torch.Tensor) -> torch.Tensor:
        """Raw image embeddings (float32, CPU) of a batch of preprocessed images."""
        return self._encode_on_device(images).cpu()

    def loader_plan(self, n_images: int, batch_size: Optional[int] = None, num_workers: Optional[int] = None):
        """The batch size, decoding workers and pinning for ``n_images`` (:func:`svgen.encoders.runtime.plan_loader`)."""
        return plan_loader(n_images, self.device, batch_size, num_workers)

    @torch.inference_mode()
    def iter_images(self, paths: Sequence[str], batch_size: Optional[int] = None, num_workers: Optional[int] = None,
                    progress: bool = False, chunk: Optional[int] = None, decode: str = "cpu"):
        """Encode image files, yielding ``(raw features, ok paths, [(failed path, reason)])`` every ``chunk``
        readable images (all at once when ``None``), from one loader whose workers decode ahead of the encoder.

        ``batch_size``/``num_workers`` default to :meth:`loader_plan`'s. ``decode="gpu"`` decodes JPEGs on the
        encoder's CUDA device (:mod:`svgen.encoders.tensor_decode`; ``"tensor"``: the same on any device).
        Unreadable and non-image files are skipped and reported, never fatal.
        """
        paths = list(paths)
        plan = self.loader_plan(len(paths), batch_size, num_workers)
        dataset, collate_fn, spec = ImageFiles(paths, self.preprocess), collate, None
        if decode not in ("cpu", "gpu", "tensor"):
            raise SvgenError(f"decode must be cpu or gpu, got {decode!r}", cli=f"--decode must be cpu or gpu, got {decode!r}")
        if decode == "gpu" and self.device.type != "cuda":
            raise SvgenError(f"decode='gpu' needs the encoder on a CUDA device; it is on {self.device}",
                             cli=f"--decode gpu needs a CUDA device; the encoder is on {self.device} (use --decode cpu)")
        if decode != "cpu":
            spec = TensorPreprocess.from_preprocess(self.preprocess)
            dataset, collate_fn = JpegBytes(paths, self.preprocess), collate_bytes
        log.info("encoding %d image(s) on %s: batch %d, %d decoding worker(s), %s, %s decoding", len(paths),
                 device_name(self.device), plan.batch_size, plan.workers,
                 self.precision_name, decode)
        loader = torch.utils.data.DataLoader(
            dataset, batch_size=plan.batch_size, num_workers=plan.workers, collate_fn=collate_fn, shuffle=False,
            pin_memory=plan.pin_memory and spec is None, prefetch_factor=plan.prefetch,
        )
        batches = loader if spec is None else decode_batches(loader, paths, self.preprocess, spec, self.device)
        if progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, total=len(loader), desc="encoding images", unit="batch", leave=False)
        feats, ok, failed, n, t0, done = [], [], [], 0, time.perf_counter(), 0
        for idx, images, bad in batches:
            failed.extend((paths[i], why) for i, why in bad)
            if images is not None:
                feats.append(self._encode_on_device(images))  # queued on the device: the next batch decodes meanwhile
                ok.extend(paths[i] for i in idx)
                n += len(idx)
            if chunk is not None and n >= chunk:
                done += n
                yield _gathered(feats), ok, failed
                feats, ok, failed, n = [], [], [], 0
        if chunk is None or ok or failed:
            gathered = _gathered(feats)
            log.info("images embedded (%d of %d) in %.2fs", done + n, len(paths), time.perf_counter() - t0)
            yield gathered, ok, failed   # the caller reports each failure, once

    def encode_images(
        self,
        paths: Sequence[str],
        batch_size: Optional[int] = None,
        num_workers: Optional[int] = None,
        progress: bool = False,
        decode: str = "cpu",
    ) -> Tuple[torch.Tensor, List[str], List[Tuple[str, str]]]:
        """Encode image files; returns (N_ok×D raw features, ok paths, [(failed path, reason)]) (:meth:`iter_images`)."""
        feats, ok, failed = next(self.iter_images(paths, batch_size, num_workers, progress, decode=decode))
        if not ok:
            feats = torch.zeros(0, 0)
        return feats, ok, failed


def _gathered(feats: List[torch.Tensor]) -> torch.Tensor:
    """One chunk's embeddings, copied to the CPU at once (one wait for the device per chunk)."""
    return torch.cat(feats).cpu() if feats else torch.zeros(0, 0)


