"""Fit settings, importable without torch (the CLI builds its --help from them)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional, Union

from .errors import SvgenError

KERNELS = ("rbf", "laplacian")
MARGIN_NAMES = ("hinge", "ce")
RIDGE_RULES = ("auto", "loo", "gcv")
METRICS = ("neighbour", "none")
LINEAR_HEADS = ("whitened", "lda")                 # closed-form linear head under the text metric
SOLVERS = ("auto", "exact", "blocked", "rff")      # alignment path per class batch (svgen.scale)
VOTE_SOLVERS = ("auto", "dense", "local")          # vote weights: dense Cholesky or sparse neighbourhoods
DEFAULT_RFF_DIM = 2048                             # random features per step on the rff path


@dataclass
class FitConfig:
    """Every setting of a fit; recorded verbatim in ``svgen.json``."""

    n_support: int = 4
    kernel: str = "rbf"
    steps: int = 0  # text-only training costs image accuracy (docs/accuracy.md); --steps N trains
    lr: float = 1e-3
    margin: str = "hinge"
    alignment_weight: float = 1.0
    margin_weight: float = 0.1
    grounding_weight: float = 1.0
    query_weight: float = 0.0
    radius: float = 0.25
    batch_classes: int = 256
    neighbours: int = 7
    learn_sigma: bool = True
    linear_init_scale: float = 10.0
    head_lr: float = 0.0
    ridge: Union[str, float] = "auto"
    parzen_factor: float = 100.0
    metric: str = "neighbour"
    metric_condition: float = 1.3
    linear_head: str = "whitened"
    query_ridge: float = 1e-3
    rff_dim: Optional[int] = None
    rff_orthogonal: bool = True
    solver: str = "auto"
    vote_solver: str = "auto"
    vote_neighbours: int = 32
    seed: int = 0

    def validate(self) -> None:
        if int(self.n_support) < 1:
            raise SvgenError(f"the number of support vectors per class (-K) must be >= 1, got {self.n_support}")
        if self.kernel not in KERNELS:
            raise SvgenError(f"unknown kernel {self.kernel!r}; expected one of {', '.join(KERNELS)}")
        if self.margin not in MARGIN_NAMES:
            raise SvgenError(f"unknown margin loss {self.margin!r}; expected one of {', '.join(MARGIN_NAMES)}")
        if int(self.steps) < 0:
            raise SvgenError(f"--steps must be >= 0, got {self.steps}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise SvgenError(f"--lr must be a positive number, got {self.lr}")
        if not (self.head_lr >= 0 and math.isfinite(self.head_lr)):
            raise SvgenError(f"head_lr must be >= 0 (0 keeps the closed-form linear head), got {self.head_lr}")
        if int(self.batch_classes) < 2:
            raise SvgenError(f"batch_classes must be >= 2, got {self.batch_classes}")
        if isinstance(self.ridge, str) and self.ridge not in RIDGE_RULES:
            raise SvgenError(f"ridge must be one of {', '.join(RIDGE_RULES)} or a positive number, got {self.ridge!r}")
        if self.metric not in METRICS:
            raise SvgenError(f"unknown metric {self.metric!r}; expected one of {', '.join(METRICS)}")
        if self.linear_head not in LINEAR_HEADS:
            raise SvgenError(f"unknown linear head {self.linear_head!r}; expected one of {', '.join(LINEAR_HEADS)}")
        if not self.metric_condition >= 1:
            raise SvgenError(f"metric_condition must be >= 1, got {self.metric_condition}")
        if not isinstance(self.ridge, str) and not self.ridge > 0:
            raise SvgenError(f"ridge must be positive, got {self.ridge}")
        if self.rff_dim is not None and int(self.rff_dim) < 1:
            raise SvgenError(f"--rff-dim must be a positive number of features, got {self.rff_dim}")
        if self.solver not in SOLVERS:
            raise SvgenError(f"unknown solver {self.solver!r}; expected one of {', '.join(SOLVERS)}")
        if self.vote_solver not in VOTE_SOLVERS:
            raise SvgenError(f"unknown vote solver {self.vote_solver!r}; expected one of {', '.join(VOTE_SOLVERS)}")
        if int(self.vote_neighbours) < 1:
            raise SvgenError(f"--vote-neighbours must be >= 1, got {self.vote_neighbours}")


def config_dict(cfg: FitConfig) -> dict:
    return asdict(cfg)
