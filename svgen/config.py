"""Fit settings, importable without torch (the CLI builds its --help from them)."""

from __future__ import annotations

import difflib
import math
import numbers
from dataclasses import asdict, dataclass, fields
from typing import Optional, Union

from svgen.errors import SvgenError, setting_error

KERNELS = ("rbf", "laplacian")
MARGIN_NAMES = ("hinge", "ce")
RIDGE_RULES = ("auto", "loo", "gcv")
METRICS = ("neighbour", "none")
LINEAR_HEADS = ("whitened", "lda")                 # closed-form linear head under the text metric
SOLVERS = ("auto", "exact", "blocked", "rff")      # alignment path per class batch (svgen.core.scale)
VOTE_SOLVERS = ("auto", "dense", "local")          # vote weights: dense Cholesky or sparse neighbourhoods
DEFAULT_RFF_DIM = 2048                             # random features per step on the rff path
MAX_SUPPORT = 256                                  # -K: the generator's last layer is 2D × K·D
MAX_SEED = 2**32 - 1                               # what numpy and torch both accept
MAX_LR = 10.0
MAX_WEIGHT = 1e6                                   # loss weights, κ, λ: beyond this only overflow
MAX_RFF_DIM = 1 << 20
MAX_STEPS = 1_000_000                              # Adam steps: beyond this a fit never ends


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

    @classmethod
    def from_params(cls, params: dict) -> "FitConfig":
        """A config from an estimator's settings (the fields it names; the rest keep their defaults), each
        ``int``/``float``/``bool`` field cast to its type, as ``SVGClassifier(n_support=4.0)`` is meant; a value of
        another type (``n_support='x'``, ``learn_sigma='no'``, ``n_support=4.5``) is one :class:`SvgenError` line."""
        return cls(**{f.name: setting(f.name, params[f.name], f.type) for f in fields(cls) if f.name in params})

    def validate(self) -> None:
        """One :class:`SvgenError` line for any setting out of its range (also for an artifact's
        recorded ``fit``, see :mod:`svgen.io.schema`); every number must be finite."""
        if not 1 <= int(self.n_support) <= MAX_SUPPORT:
            rest = f"must be >= 1 and <= {MAX_SUPPORT}, got {self.n_support}"
            raise SvgenError(f"n_support (support vectors per class) {rest}",
                             cli=f"the number of support vectors per class (-K) {rest}")
        if not 0 <= int(self.seed) <= MAX_SEED:
            raise setting_error("seed", "--seed", f"must be in 0..{MAX_SEED}, got {self.seed}")
        if not (0 < self.lr <= MAX_LR):
            raise setting_error("lr", "--lr", f"must be a positive number <= {MAX_LR:g}, got {self.lr}")
        for name, flag in (("alignment_weight", "alignment_weight"), ("margin_weight", "--margin-weight"),
                           ("grounding_weight", "--grounding-weight"), ("query_weight", "query_weight")):
            if not 0 <= getattr(self, name) <= MAX_WEIGHT:
                raise setting_error(name, flag, f"must be in [0, {MAX_WEIGHT:g}], got {getattr(self, name)}")
        for name in ("radius", "parzen_factor", "query_ridge", "linear_init_scale"):
            if not (0 < getattr(self, name) <= MAX_WEIGHT):
                raise SvgenError(f"{name} must be a positive number <= {MAX_WEIGHT:g}, got {getattr(self, name)}")
        if not 1 <= int(self.neighbours):
            raise SvgenError(f"neighbours must be >= 1, got {self.neighbours}")
        if self.kernel not in KERNELS:
            raise SvgenError(f"unknown kernel {self.kernel!r}; expected one of {', '.join(KERNELS)}")
        if self.margin not in MARGIN_NAMES:
            raise SvgenError(f"unknown margin loss {self.margin!r}; expected one of {', '.join(MARGIN_NAMES)}")
        if not 0 <= int(self.steps) <= MAX_STEPS:
            raise setting_error("steps", "--steps", f"must be >= 0 and <= {MAX_STEPS}, got {self.steps}")
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
        if not 1 <= self.metric_condition <= MAX_WEIGHT:
            raise setting_error("metric_condition", "--metric-strength",
                                f"must be in [1, {MAX_WEIGHT:g}], got {self.metric_condition}")
        if not isinstance(self.ridge, str) and not 0 < self.ridge <= MAX_WEIGHT:
            raise SvgenError(f"ridge must be a positive number <= {MAX_WEIGHT:g}, got {self.ridge}")
        if self.rff_dim is not None and not 1 <= int(self.rff_dim) <= MAX_RFF_DIM:
            raise setting_error("rff_dim", "--rff-dim", f"must be in 1..{MAX_RFF_DIM}, got {self.rff_dim}")
        if self.solver not in SOLVERS:
            raise SvgenError(f"unknown solver {self.solver!r}; expected one of {', '.join(SOLVERS)}")
        if self.vote_solver not in VOTE_SOLVERS:
            raise SvgenError(f"unknown vote solver {self.vote_solver!r}; expected one of {', '.join(VOTE_SOLVERS)}")
        if int(self.vote_neighbours) < 1:
            raise setting_error("vote_neighbours", "--vote-neighbours", f"must be >= 1, got {self.vote_neighbours}")


def setting(name: str, value, kind: str):
    """``value`` as a setting of type ``kind`` ("int", "float", "bool", "Optional[int]", "Union[str, float]"; any
    other kind passes through): numbers of the right kind are cast (numpy's included, a whole float as an int),
    anything else is one :class:`SvgenError` line (a bool is not a number here, nor a string True)."""
    is_bool = type(value).__name__ in ("bool", "bool_")   # Python's or numpy's, without importing numpy
    number = isinstance(value, numbers.Real) and not is_bool
    if kind == "bool":
        if is_bool:
            return bool(value)
        raise SvgenError(f"{name} must be True or False, got {value!r}")
    if kind == "Optional[int]" and value is None:
        return None
    if kind in ("int", "Optional[int]"):
        if number and (isinstance(value, numbers.Integral) or float(value).is_integer()):
            return int(value)
        raise SvgenError(f"{name} must be a whole number, got {value!r}")
    if kind == "float" or (kind == "Union[str, float]" and not isinstance(value, str)):
        if number:
            return float(value)
        raise SvgenError(f"{name} must be a number{' or one of ' + ', '.join(RIDGE_RULES) if kind != 'float' else ''}"
                         f", got {value!r}")
    return value


def checked(name: str, default, v):
    """A settings field's value of the kind its ``default`` is: a grid (tuple) a non-empty tuple of finite numbers
    >= 0 (a list is taken), a count an integer, else a finite number; all >= 0. Raises one line naming ``name``."""
    if isinstance(default, tuple):
        if not (isinstance(v, (tuple, list)) and len(v) > 0 and all(_number(x) and math.isfinite(x) and x >= 0
                                                                   for x in v)):
            raise SvgenError(f"{name} must be a non-empty list of finite numbers >= 0, got {v!r}")
        return tuple(float(x) for x in v)
    if isinstance(default, int):
        if not (isinstance(v, numbers.Integral) and not _is_bool(v) and v >= 0):
            raise SvgenError(f"{name} must be an integer >= 0, got {v!r}")
        return int(v)
    if not (_number(v) and math.isfinite(v) and v >= 0):
        raise SvgenError(f"{name} must be a finite number >= 0, got {v!r}")
    return float(v)


def known_names(given, names: list, where: str, what: str) -> None:
    """One :class:`SvgenError` line for the first key of ``given`` not among ``names`` (with the nearest one)."""
    for k in given:
        if k not in names:
            near = difflib.get_close_matches(str(k), names, n=1)
            raise SvgenError(f"{where}: {k!r} is not {what}"
                             + (f" (did you mean {near[0]!r}?)" if near else f"; the fields: {', '.join(names)}"))


def _is_bool(v) -> bool:
    return type(v).__name__ in ("bool", "bool_")   # Python's or numpy's, without importing numpy


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not _is_bool(v)


def config_dict(cfg: FitConfig) -> dict:
    return asdict(cfg)
