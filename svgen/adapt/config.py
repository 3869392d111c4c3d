"""The settings of every adaptive choice (:class:`AdaptConfig`): grids, sizes and the one level; docs/adaptation.md."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Tuple

import numpy as np

from svgen.config import checked, known_names
from svgen.errors import SvgenError


@dataclass(frozen=True)
class AdaptConfig:
    """``SVGClassifier(adapt_config=...)``; each field: docs/adaptation.md, "The settings"."""

    level: float = 1.0
    select_max: int = 1024
    max_folds: int = 4
    sigma_factors: Tuple[float, ...] = (0.35, 0.5, 0.7, 1.0)
    ridges: Tuple[float, ...] = tuple(float(10.0 ** p) for p in np.arange(-3.0, 1.51, 0.5))
    one_shot_beta: float = 5.5
    one_shot_ridge: float = 1.0
    select_basis: int = 1024
    dense_max: int = 4096
    nystrom_basis: int = 1536
    lda_shrinkage: Tuple[float, ...] = (0.02, 0.05, 0.1, 0.2, 0.4, 0.7)
    lda_prior: Tuple[float, ...] = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0)
    lda_loo_max: int = 512
    lda_prior_one_shot: float = 4.0
    alphas: Tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
    kernel_floors: Tuple[float, ...] = (0.1, 0.3, 0.5, 0.9)
    class_folds: int = 8
    refits: int = 4
    neighbours: int = 3
    rounds: int = 10
    steps: int = 5
    prior_pseudo_images: float = 1.0
    min_pool_per_class: float = 1.0
    stable: float = 0.999
    escalate: float = 4.0
    max_escalations: int = 4
    pool_trust: float = 0.7
    max_queries: int = 2048
    max_logits: int = 4_000_000

    def __post_init__(self):
        for f in fields(self):
            object.__setattr__(self, f.name, checked(f"AdaptConfig.{f.name}", f.default, getattr(self, f.name)))
        for name in ("select_max", "max_folds", "lda_loo_max", "class_folds", "rounds", "steps"):
            if getattr(self, name) < 1:
                raise SvgenError(f"AdaptConfig.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        if not 0.0 < self.pool_trust <= 1.0:
            raise SvgenError(f"AdaptConfig.pool_trust must be in (0, 1], got {self.pool_trust!r}")

    def changed(self) -> dict:
        """The settings that differ from the defaults (what ``svgen.json`` records, ``adapt_config``)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) != f.default}

    @classmethod
    def from_dict(cls, settings, where: str = "adapt settings") -> "AdaptConfig":
        """The settings a JSON object names (lists for the grids), the others their defaults; an unknown field or a
        bad value is one :class:`SvgenError` line naming it (``where``: what held them, e.g. a file)."""
        if not isinstance(settings, dict):
            raise SvgenError(f"{where} must be a table of AdaptConfig fields, got {type(settings).__name__}")
        known_names(settings, [f.name for f in fields(cls)], where, "an AdaptConfig field")
        try:
            return cls(**settings)
        except SvgenError as e:
            raise SvgenError(f"{where}: {e}") from None


DEFAULT = AdaptConfig()
