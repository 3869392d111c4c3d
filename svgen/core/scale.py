"""Many classes in bounded memory: alignment paths, large-M vote weights, bounded estimates.

The kernel over all M = C·K support vectors has M² entries (7.6·10⁹ for ImageNet-21k at K=4).
Nothing here forms it when M is large.

**Alignment** ``A(K, YYᵀ) = <K, YYᵀ>_F / sqrt(<K,K>_F · C·K²)`` of one class batch (B classes):

* ``exact``   — the full (B·K)² kernel, then :func:`svgen.core.losses.block_alignment`;
* ``blocked`` — the same value streamed: ``<K,YYᵀ>`` from the B diagonal K×K blocks and
  ``<K,K>_F = Σ_blocks ||K[rows, :]||²`` over row blocks, each block recomputed in the backward
  pass (activation checkpointing), so memory is O(block·B·K) instead of O((B·K)²);
* ``rff``     — random Fourier features ``K ≈ ΦΦᵀ``: ``<K,YYᵀ> ≈ ||ΦᵀY||²_F`` and
  ``<K,K> ≈ ||ΦᵀΦ||²_F`` at O(B·K·m) memory and O(B·K·m·(D+m)) time.

:func:`plan_fit` picks one from the batch size and the memory available (``solver="auto"``) and
the plan is recorded in ``svgen.json`` (``metrics.scale``).

**Vote weights** ``A = (K_SS + M·λ·I)⁻¹ Y`` (M×C):

* ``dense`` — one float64 Cholesky of the M×M system (ordinary sizes; the artifact stores A
  dense, as before);
* ``local`` — for large M a dense A cannot even be stored (M×C = 87,372×21,843 floats = 7.6 GB).
  Column c of A is solved on the support vectors of c's ``vote_neighbours`` nearest classes only,
  ``(K_NN + M·λ·I) a = Y_N e_c``, and stored as a sparse COO matrix. With the default large ridge
  (M·λ ≫ ||K||) the exact solution is ``Y/(Mλ) − K Y/(Mλ)² + …``, so the dropped entries are
  O(1/(Mλ)²) each; the relative residual ``||(K+MλI)A − Y|| / ||Y||`` is measured on a sample of
  columns and recorded. Scores stay exactly ``k(x̂, S) @ A`` for the stored (sparse) A.

**Estimates** for large M: alignment and condition number on a random subset of classes (a
principal submatrix: its condition number is a lower bound of the full one), labelled as such.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from svgen.config import DEFAULT_RFF_DIM
from svgen.errors import SvgenError
from svgen.core.ridge import top_eigenvalue
from svgen.core.kernels import RandomFourierFeatures, kernel, kernel_from_sq_dists
from svgen.core.metric import nearest_classes

log = logging.getLogger(__name__)

DENSE_VOTE_MAX_M = 12288         # float64 M×M system ≈ 1.2 GB at this size
EXACT_BYTES_PER_ENTRY = 4 * 6    # float32 kernel, distances, squares and their gradients
MEMORY_FRACTION = 0.25           # of the memory available when the fit starts
MEMORY_CAP = 2 << 30             # and never more than 2 GiB for one step / one solve


def available_memory() -> int:
    """Bytes of memory available now (psutil; 4 GiB when it cannot tell)."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # pragma: no cover - psutil missing or unsupported platform
        return 4 << 30


def memory_budget(available: Optional[int] = None) -> int:
    avail = available_memory() if available is None else int(available)
    return int(min(MEMORY_FRACTION * avail, MEMORY_CAP))


# ---------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class ScalePlan:
    """How one fit scales: recorded verbatim under ``metrics.scale`` in ``svgen.json``."""

    alignment_path: str       # exact | blocked | rff (per class batch)
    batch_support_vectors: int
    rff_dim: Optional[int]
    rff_orthogonal: bool
    vote_solver: str          # dense | local
    vote_neighbours: Optional[int]
    n_support_vectors: int
    memory_budget_bytes: int
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def choose_alignment_path(batch_m: int, dim: int, rff_dim: Optional[int], budget: int) -> tuple:
    """(path, reason): exact when the (B·K)² graph fits the budget, else blocked or rff by cost."""
    exact_bytes = EXACT_BYTES_PER_ENTRY * batch_m * batch_m
    if exact_bytes <= budget:
        return "exact", f"(B·K)²={batch_m}² kernel graph ≈ {exact_bytes / 2**20:.0f} MiB fits the budget"
    m = rff_dim or DEFAULT_RFF_DIM
    blocked_flops, rff_flops = batch_m * batch_m * dim, batch_m * m * (dim + m)
    if blocked_flops <= 4 * rff_flops:
        return "blocked", f"(B·K)² graph ≈ {exact_bytes / 2**20:.0f} MiB exceeds the budget; streaming is cheap enough"
    return "rff", f"(B·K)²·D = {blocked_flops:.2g} flops per step ≫ B·K·m·(D+m) = {rff_flops:.2g}"


def choose_vote_solver(m_total: int, n_classes: int, budget: int) -> tuple:
    """(solver, reason): a dense float64 Cholesky when the M×M system and dense A fit, else local."""
    dense_bytes = dense_vote_bytes(m_total, n_classes)
    if m_total <= DENSE_VOTE_MAX_M and dense_bytes <= max(budget, 1 << 30):
        return "dense", f"M={m_total}: dense system ≈ {dense_bytes / 2**20:.0f} MiB"
    return "local", (f"M={m_total}: a dense system ({8 * m_total ** 2 / 2**30:.1f} GiB) and dense A "
                     f"({4 * m_total * n_classes / 2**30:.1f} GiB) do not fit; sparse neighbourhood solve")


def dense_vote_bytes(m_total: int, n_classes: int) -> int:
    """Peak bytes of the dense vote solve: the float64 M×M system and its Cholesky factor, and A."""
    return 8 * m_total * m_total * 2 + 4 * m_total * n_classes


@functools.lru_cache(maxsize=32)
def _plan(n_classes, n_support, dim, batch_classes, solver, rff_dim, orthogonal, vote_solver, vote_neighbours,
          available) -> ScalePlan:
    budget = memory_budget(available)
    batch_m = min(n_classes, batch_classes) * n_support
    if solver == "auto":
        path, why = choose_alignment_path(batch_m, dim, rff_dim, budget)
    else:
        path, why = solver, "requested"
    m_total = n_classes * n_support
    if vote_solver == "auto":
        vs, vwhy = choose_vote_solver(m_total, n_classes, budget)
    else:
        vs, vwhy = vote_solver, "requested"
        need = dense_vote_bytes(m_total, n_classes)
        if vs == "dense" and need > 0.8 * available:  # refused at the first plan, i.e. before any training
            rest = f"needs ≈ {need / 2**30:.1f} GiB for M = {m_total} support vectors but {available / 2**30:.1f} GiB is available"
            raise SvgenError(f"vote_solver='dense' {rest}; use vote_solver='auto' or 'local' (sparse vote weights)",
                             cli=f"--vote-solver dense {rest}; use --vote-solver auto or local (sparse vote weights)")
    m = (rff_dim or DEFAULT_RFF_DIM) if path == "rff" else rff_dim
    return ScalePlan(path, batch_m, m, bool(orthogonal), vs, int(vote_neighbours) if vs == "local" else None,
                     m_total, budget, f"alignment: {why}; vote weights: {vwhy}")


def plan_fit(cfg, n_classes: int, dim: int, available: Optional[int] = None) -> ScalePlan:
    """The :class:`ScalePlan` of a fit (memoised: the same inputs give the same plan in a process).

    It is asked for on every training step, so the memory available is read once per process.
    """
    return _plan(int(n_classes), int(cfg.n_support), int(dim), int(cfg.batch_classes),
                 getattr(cfg, "solver", "auto"), cfg.rff_dim, bool(getattr(cfg, "rff_orthogonal", True)),
                 getattr(cfg, "vote_solver", "auto"), int(getattr(cfg, "vote_neighbours", 32)),
                 _available_once() if available is None else int(available))


@functools.lru_cache(maxsize=1)
def _available_once() -> int:
    return available_memory()


# ---------------------------------------------------------------------------------- alignment
def same_class_sum(S3: torch.Tensor, sigma, kind: str = "rbf") -> torch.Tensor:
    """``<K, YYᵀ>_F = Σ_c Σ_{k,l} k(s_ck, s_cl)`` from the C diagonal K×K blocks (S3 is C×K×D)."""
    S3 = F.normalize(S3, dim=-1)
    gram = torch.einsum("ckd,cld->ckl", S3, S3)
    return kernel_from_sq_dists((2.0 - 2.0 * gram).clamp_min(0.0), sigma, kind).sum()


def _block_fro_sq(rows, S, sigma, kind):
    return kernel(rows, S, sigma, kind).square().sum()


def blocked_fro_sq(S: torch.Tensor, sigma, kind: str = "rbf", block: int = 2048, grad: Optional[bool] = None):
    """``<K, K>_F = Σ_ij k(s_i, s_j)²`` streamed over row blocks of ``block`` rows.

    With gradients, each block is recomputed in the backward pass, so peak memory is
    O(block·M) rather than O(M²).
    """
    grad = torch.is_grad_enabled() and (S.requires_grad or torch.is_tensor(sigma) and sigma.requires_grad) \
        if grad is None else grad
    total = S.new_zeros(())
    for start in range(0, S.shape[0], block):
        rows = S[start:start + block]
        if grad:
            total = total + checkpoint(_block_fro_sq, rows, S, sigma, kind, use_reentrant=False)
        else:
            total = total + _block_fro_sq(rows, S, sigma, kind)
    return total


def blocked_alignment(S3: torch.Tensor, sigma, kind: str = "rbf", block: int = 2048) -> torch.Tensor:
    """Exactly :func:`svgen.core.losses.block_alignment` of ``k(S, S)`` without forming the M×M kernel."""
    C, K = S3.shape[0], S3.shape[1]
    same = same_class_sum(S3, sigma, kind)
    fro = blocked_fro_sq(S3.reshape(C * K, -1), sigma, kind, block)
    return same / torch.sqrt(fro * float(C * K * K))


def rff_alignment(S3: torch.Tensor, sigma, features: RandomFourierFeatures) -> torch.Tensor:
    """Alignment from random features: ``||ΦᵀY||²_F / sqrt(||ΦᵀΦ||²_F · C·K²)``."""
    from svgen.core.losses import rff_alignment_terms

    C, K = S3.shape[0], S3.shape[1]
    phi = features(S3.reshape(C * K, -1), sigma)
    same, fro = rff_alignment_terms(phi, C, K)
    return same / torch.sqrt(fro * float(C * K * K))


@functools.lru_cache(maxsize=8)
def rff_features(dim: int, n_features: int, kind: str, orthogonal: bool, seed: int) -> RandomFourierFeatures:
    """One fixed draw of cos/sin-paired features per (dim, m, kernel, orthogonal, seed); σ rescales it
    at call time. Orthogonal directions apply to the RBF kernel only."""
    return RandomFourierFeatures(dim, n_features + n_features % 2, kind, orthogonal=orthogonal and kind == "rbf",
                                 seed=seed, paired=True)


def batch_alignment(S3: torch.Tensor, sigma, kind: str, plan: ScalePlan, seed: int = 0):
    """(alignment, K_SS or None) of one class batch along the planned path."""
    if plan.alignment_path == "exact":
        from svgen.core.losses import block_alignment

        flat = S3.reshape(-1, S3.shape[-1])
        K_ss = kernel(flat, flat, sigma, kind)
        return block_alignment(K_ss, S3.shape[0], S3.shape[1]), K_ss
    if plan.alignment_path == "blocked":
        return blocked_alignment(S3, sigma, kind), None
    feats = rff_features(S3.shape[-1], plan.rff_dim or DEFAULT_RFF_DIM, kind, plan.rff_orthogonal, seed)
    return rff_alignment(S3, sigma, feats), None


def subset_classes(n_classes: int, max_classes: int, seed: int = 0) -> Optional[torch.Tensor]:
    """Sorted random subset of class indices when ``n_classes > max_classes`` (else None)."""
    if n_classes <= max_classes:
        return None
    g = torch.Generator().manual_seed(seed)
    return torch.randperm(n_classes, generator=g)[:max_classes].sort().values


def alignment_value(S3: torch.Tensor, sigma: float, kind: str, max_classes: int = 2048, seed: int = 0) -> tuple:
    """(alignment, classes used): exact blocked value over all classes, or over a random subset."""
    idx = subset_classes(S3.shape[0], max_classes, seed)
    sub = S3 if idx is None else S3[idx]
    with torch.no_grad():
        value = float(blocked_alignment(sub.double(), float(sigma), kind, block=1024))
    return value, int(sub.shape[0])


# ---------------------------------------------------------------------------------- vote weights
def class_neighbours(centres: torch.Tensor, n: int) -> torch.Tensor:
    """C×n class indices: each class itself first, then its n−1 nearest classes by cosine."""
    n = min(n, centres.shape[0])
    return torch.cat([torch.arange(centres.shape[0])[:, None], nearest_classes(centres, n - 1)], dim=1)


def local_vote_weights(S3: torch.Tensor, sigma: float, kind: str, lam: float, n_neighbours: int = 32,
                       chunk: int = 256) -> torch.Tensor:
    """Sparse M×C vote weights: column c solves ``(K_NN + M·λ·I) a = Y_N e_c`` on c's neighbourhood.

    N = the support vectors of c and its ``n_neighbours − 1`` nearest classes (by the cosine of
    their mean support vectors). Returns a coalesced float32 sparse COO tensor.
    """
    C, K, D = S3.shape
    M = C * K
    reg = M * float(lam)
    nb = class_neighbours(S3.mean(dim=1), n_neighbours)           # C×n, column 0 = the class itself
    n = nb.shape[1]
    offs = torch.arange(K)
    rows_all, vals_all = [], []
    rhs = torch.zeros(n * K, 1, dtype=torch.float64)
    rhs[:K] = 1.0
    eye = torch.eye(n * K, dtype=torch.float64)
    S64 = S3.detach()
    for s in range(0, C, chunk):
        ids = nb[s:s + chunk]                                      # b×n
        X = F.normalize(S64[ids].reshape(ids.shape[0], n * K, D).double(), dim=-1)
        gram = torch.bmm(X, X.transpose(1, 2))
        system = kernel_from_sq_dists((2.0 - 2.0 * gram).clamp_min(0.0), sigma, kind)
        system.add_(eye, alpha=reg)
        L = torch.linalg.cholesky(system)
        a = torch.cholesky_solve(rhs.expand(ids.shape[0], n * K, 1), L)[..., 0]
        rows_all.append((ids[:, :, None] * K + offs).reshape(ids.shape[0], n * K))
        vals_all.append(a.float())
    rows = torch.cat(rows_all)
    cols = torch.arange(C)[:, None].expand(C, n * K)
    idx = torch.stack([rows.reshape(-1), cols.reshape(-1)])
    return torch.sparse_coo_tensor(idx, torch.cat(vals_all).reshape(-1), (M, C), check_invariants=False).coalesce()


def vote_residual(S3: torch.Tensor, sigma: float, kind: str, lam: float, A: torch.Tensor, n_columns: int = 8,
                  seed: int = 0) -> float:
    """Relative residual ``||(K + M·λ·I) A_J − Y_J||_F / ||Y_J||_F`` on a random sample J of columns."""
    C, K, D = S3.shape
    M = C * K
    g = torch.Generator().manual_seed(seed)
    cols = torch.randperm(C, generator=g)[:min(n_columns, C)]
    S = S3.reshape(M, D).double()
    A_J = (A.index_select(1, cols).to_dense() if A.is_sparse else A[:, cols]).double()
    Y_J = torch.zeros(M, len(cols), dtype=torch.float64)
    for j, c in enumerate(cols.tolist()):
        Y_J[c * K:(c + 1) * K, j] = 1.0
    nz = (A_J != 0).any(dim=1).nonzero()[:, 0]                     # only rows that carry weight
    KA = torch.zeros(M, len(cols), dtype=torch.float64)
    for start in range(0, M, 8192):
        KA[start:start + 8192] = kernel(S[start:start + 8192], S[nz], sigma, kind) @ A_J[nz]
    R = KA + M * float(lam) * A_J - Y_J
    return float(R.norm() / Y_J.norm())


# ---------------------------------------------------------------------------------- spectra
EXACT_SPECTRUM_MAX_M = 2048


def extreme_eigenvalues(K: torch.Tensor, iters: int = 60, tol: float = 1e-6) -> Optional[tuple]:
    """(λ_min, λ_max) of a PSD matrix: power iteration for λ_max, inverse iteration (on a Cholesky of
    ``K + δI``, δ = 1e-13·λ_max) for λ_min, each stopped once the estimate changes by less than
    ``tol`` (relative). None when K is numerically singular (Cholesky fails)."""
    K = K.double()
    M = K.shape[0]
    lam_max = top_eigenvalue(K, iters, tol)
    delta = 1e-13 * lam_max
    L, info = torch.linalg.cholesky_ex(K + delta * torch.eye(M, dtype=torch.float64))
    if int(info) != 0:
        return None
    v = torch.randn(M, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    v /= v.norm()
    mu = 0.0
    for _ in range(iters):
        w = torch.cholesky_solve(v, L)
        prev, mu = mu, float(w.norm())
        v = w / mu
        if abs(mu - prev) <= tol * mu:
            break
    lam_min = 1.0 / mu - delta
    return (lam_min, lam_max) if lam_min > 0 else None


def condition_estimate(S3: torch.Tensor, sigma: float, kind: str, K_ss: Optional[torch.Tensor] = None,
                       max_classes: int = 1024, seed: int = 0, exact_max_m: int = EXACT_SPECTRUM_MAX_M) -> dict:
    """Condition number of K_SS, ``{"value", "method", "classes"}``; value None = numerically singular.

    * M ≤ 2048: all eigenvalues (``eigvalsh``), exact;
    * larger: power iteration (λ_max) and inverse iteration (λ_min): an estimate from below;
    * without K_SS and more than ``max_classes`` classes: the same on a random principal submatrix
      over ``max_classes`` classes — a lower bound of the full condition number (interlacing).
    """
    idx = None
    if K_ss is None:
        idx = subset_classes(S3.shape[0], max_classes, seed)
        sub = S3 if idx is None else S3[idx]
        flat = sub.reshape(-1, sub.shape[-1]).double()
        K_ss = kernel(flat, flat, float(sigma), kind)
    classes = S3.shape[0] if idx is None else int(idx.shape[0])
    with torch.no_grad():
        if K_ss.shape[0] <= exact_max_m:
            eig = torch.linalg.eigvalsh(K_ss.double())
            cond, method = (float(eig.max() / eig.min()) if eig.min() > 0 else None), "eigvalsh"
        else:
            ext = extreme_eigenvalues(K_ss)
            cond, method = (ext[1] / ext[0] if ext else None), "power/inverse iteration estimate"
    if idx is not None:
        method = f"{method} on a random principal submatrix (lower bound)"
    return {"value": cond, "method": method, "classes": classes}


def sparse_layout(A: torch.Tensor) -> Optional[dict]:
    """What ``svgen.json`` says about a sparse vote-weight matrix (None for dense)."""
    if not A.is_sparse:
        return None
    return {"layout": "coo", "shape": list(A.shape), "nnz": int(A._nnz()),
            "tensors": ["vote_weights.indices", "vote_weights.values"]}
