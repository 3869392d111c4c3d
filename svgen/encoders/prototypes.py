"""Class prototypes from prompts, with a disk cache of prompt embeddings.

For C classes and T templates the encoder yields per-template embeddings ``E`` (C×T×D, each row
L2-normalised) and prototypes ``p_c = normalize(mean_t E[c, t])`` (C×D), CLIP's zero-shot recipe.

The cache maps (encoder identity, exact prompt text) to the raw embedding. It lives in
``$SVGEN_CACHE_DIR`` (default ``~/.cache/svgen``), one safetensors file per encoder identity with
the prompt list in its metadata. Building the same classes again encodes nothing; adding one
class encodes only that class's prompts.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from svgen.errors import SvgenError
from svgen.core.generator import prototypes_from_embeddings  # noqa: F401  (also read from here)
from svgen import safeio
from svgen.encoders.prompts import build_prompts

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Where prompt embeddings are cached: ``$SVGEN_CACHE_DIR`` or ``~/.cache/svgen``."""
    return Path(os.environ.get("SVGEN_CACHE_DIR") or Path.home() / ".cache" / "svgen")


@dataclass
class Prototypes:
    """``per_template`` C×T×D (unit rows) and ``mean`` C×D (unit rows), float32."""

    per_template: torch.Tensor
    mean: torch.Tensor
    classes: List[str]
    templates: List[str]
    encoded: int = 0  # prompts actually run through the encoder (the rest came from the cache)


def short_name(name: str, limit: int = 40) -> str:
    """A class name fit for a one-line message: quoted, cut at ``limit`` characters with its length said."""
    return repr(name) if len(name) <= limit else f"{name[:limit]!r}… ({len(name)} characters)"


class PromptCache:
    """Raw prompt embeddings for one encoder identity, stored as one safetensors file.

    ``key=None`` keeps the table in memory only.
    """

    def __init__(self, key: Optional[str], root: Optional[Path] = None):
        self.path = Path(root or cache_dir()) / f"text-{key}.safetensors" if key else None
        self.table: Dict[str, torch.Tensor] = {}
        if self.path is not None and self.path.is_file():
            try:
                with safe_open(str(self.path), framework="pt") as f:
                    prompts = json.loads(f.metadata()["prompts"])
                    emb = f.get_tensor("embeddings")
                self.table = dict(zip(prompts, emb))
            except Exception as e:  # a corrupt cache is rebuilt, never fatal
                log.warning("ignoring unreadable prompt cache %s (%s)", self.path, e)

    def missing(self, prompts: Sequence[str]) -> List[str]:
        seen, out = set(), []
        for p in prompts:
            if p not in self.table and p not in seen:
                seen.add(p)
                out.append(p)
        return out

    def add(self, prompts: Sequence[str], emb: torch.Tensor) -> None:
        for p, e in zip(prompts, emb):
            self.table[p] = e.clone()

    def save(self) -> None:
        """Write atomically (temporary file, then rename)."""
        if self.path is None:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            prompts = list(self.table)
            emb = torch.stack([self.table[p] for p in prompts]).contiguous()
            safeio.atomic_file(self.path, lambda tmp: save_file({"embeddings": emb}, str(tmp),
                                                                metadata={"prompts": json.dumps(prompts)}), force=True)
        except (OSError, SvgenError) as e:  # a read-only cache dir slows later runs down but breaks nothing
            log.warning("could not write prompt cache %s (%s)", self.path, e)

    def lookup(self, prompts: Sequence[str]) -> torch.Tensor:
        return torch.stack([self.table[p] for p in prompts])


def build_prototypes(
    encoder,
    classes: Sequence[str],
    templates: Sequence[str],
    use_cache: bool = True,
    batch_size: Optional[int] = None,
    progress: bool = False,
) -> Prototypes:
    """Encode every (class, template) prompt (cached ones excepted) into :class:`Prototypes`."""
    grid = build_prompts(classes, templates)
    flat = [p for row in grid for p in row]
    too_long = set(encoder.too_long(sorted(set(flat))))
    if too_long:
        named = [short_name(c) for c, row in zip(classes, grid) if any(p in too_long for p in row)]
        log.warning("%d class(es) give prompts longer than the %d-token context, which the tokenizer truncates: %s",
                    len(named), encoder.context_length, ", ".join(named[:5]) + (", …" if len(named) > 5 else ""))
    cache = PromptCache(encoder.identity_key() if use_cache else None)
    todo = cache.missing(flat)
    if todo:
        log.info("encoding %d of %d prompts (%d cached)", len(todo), len(set(flat)), len(set(flat)) - len(todo))
        cache.add(todo, encoder.encode_text(todo, batch_size=batch_size, progress=progress))
        cache.save()
    return _from_cache(cache, classes, templates, encoded=len(todo))


def cached_prototypes(key: str, classes: Sequence[str], templates: Sequence[str]) -> Optional[Prototypes]:
    """:class:`Prototypes` from the prompt cache of encoder identity ``key`` alone, or ``None``
    when any prompt is missing (then the encoder has to be loaded: :func:`build_prototypes`)."""
    cache = PromptCache(key)
    if cache.missing([p for row in build_prompts(classes, templates) for p in row]):
        return None
    return _from_cache(cache, classes, templates, encoded=0)


def _from_cache(cache: PromptCache, classes, templates, encoded: int) -> Prototypes:
    flat = [p for row in build_prompts(classes, templates) for p in row]
    raw = cache.lookup(flat).view(len(classes), len(templates), -1)
    per_template, mean = prototypes_from_embeddings(raw)
    return Prototypes(per_template, mean, list(classes), list(templates), encoded=encoded)
