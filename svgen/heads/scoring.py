"""The three classification heads (their closed-form kernel ridge solves: :mod:`svgen.core.ridge`).

One implementation each, shared by the Python API, the CLI and the exporters:

* cosine (the plain CLIP baseline): ``100 · x̂ P̂ᵀ``
* kernel vote:                      ``k(x̂, S) @ A`` with ``A = (K_SS + M·λ·I)⁻¹ Y``
* linear:                           ``x̂ Wᵀ + b``

``x̂ = x / ||x||``. Scores are not probabilities; :mod:`svgen.adapt.temperatures` turns them into some.
"""

from __future__ import annotations

import warnings
import weakref
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from svgen.heads.calibration import MIXTURE as MIXTURE
from svgen.core.kernels import kernel

HEADS = ("kernel", "linear", "cosine")
CLIP_LOGIT_SCALE = 100.0   # CLIP's own calibration: softmax(100 · cos), as in open_clip; svgen's one copy


def cosine_logits(x: torch.Tensor, prototypes: torch.Tensor, scale: float = CLIP_LOGIT_SCALE) -> torch.Tensor:
    """CLIP zero-shot logits ``scale · x̂ p̂ᵀ`` (N×C)."""
    return scale * F.normalize(x, dim=-1) @ F.normalize(prototypes, dim=-1).T


def prior_probs(x: torch.Tensor, prototypes: torch.Tensor, scale: float = CLIP_LOGIT_SCALE) -> torch.Tensor:
    """CLIP's zero-shot probabilities ``softmax(scale · x̂ p̂ᵀ)`` (N×C): the prior term of an adapted kernel
    head (:mod:`svgen.adapt.residual`)."""
    return torch.softmax(cosine_logits(x.float(), prototypes.float(), scale), dim=1)


def linear_logits(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Linear-head logits ``x̂ Wᵀ + b`` (N×C)."""
    return F.normalize(x, dim=-1) @ weight.T + bias


def kernel_from_gram_(G: torch.Tensor, sigma: float, kind: str) -> torch.Tensor:
    """In place on ``G = x̂ Ŝᵀ``: RBF ``exp(-(2 - 2G)/2σ²) = exp((G - 1)/σ²)`` or Laplacian
    ``exp(-sqrt(2 - 2G)/σ)`` (same clamping as :func:`svgen.core.kernels.kernel`), without temporaries."""
    if kind == "rbf":
        return G.clamp_(max=1.0).sub_(1.0).mul_(1.0 / (sigma * sigma)).exp_()
    if kind == "laplacian":
        return G.mul_(-2.0).add_(2.0).clamp_(min=0.0).add_(1e-12).sqrt_().mul_(-1.0 / sigma).exp_()
    raise ValueError(f"unknown kernel {kind!r}")


def sparse_row_blocks(A: torch.Tensor, block_size: int):
    """Row blocks ``A[s:s+block_size]`` of a sparse COO matrix, each a sparse COO (block×C) tensor."""
    A = A.coalesce()
    idx, val = A.indices(), A.values()
    M, C = A.shape
    bounds = torch.searchsorted(idx[0].contiguous(), torch.arange(0, M + block_size, block_size))
    out = []
    for b, start in enumerate(range(0, M, block_size)):
        lo, hi = int(bounds[b]), int(bounds[b + 1])
        rows = min(block_size, M - start)
        sub = torch.stack([idx[0, lo:hi] - start, idx[1, lo:hi]])
        out.append(torch.sparse_coo_tensor(sub, val[lo:hi], (rows, C), is_coalesced=True,
                                               check_invariants=False))
    return out


_CSR_CACHE: dict = {}  # id(A) -> (weakref to A, block_size, blocks); tensors are not hashable by value


def _csr_blocks(A: torch.Tensor, block_size: int):
    """Aᵀ row blocks as CSR (CSR @ dense is ~16× faster than dense @ COO on CPU), cached per tensor."""
    hit = _CSR_CACHE.get(id(A))
    if hit is not None and hit[0]() is A and hit[1] == block_size:
        return hit[2]
    with warnings.catch_warnings():  # torch: "Sparse CSR tensor support is in beta state"
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        blocks = [blk.t().coalesce().to_sparse_csr() for blk in sparse_row_blocks(A, block_size)]
    for key in [k for k, v in _CSR_CACHE.items() if v[0]() is None]:
        del _CSR_CACHE[key]
    _CSR_CACHE[id(A)] = (weakref.ref(A), block_size, blocks)
    return blocks


def kernel_scores(
    x: torch.Tensor,
    support: torch.Tensor,
    sigma,
    vote_weights: torch.Tensor,
    kind: str = "rbf",
    block_size: int = 8192,
    kernel_out: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Kernel-vote scores ``k(x̂, S) @ A`` (N×C), streamed over blocks of support vectors.

    ``support`` is M×D (class-major) or C×K×D; ``vote_weights`` is dense M×C or a sparse COO
    M×C tensor (large-C artifacts, see :mod:`svgen.core.scale`). Memory is O(N·block_size + N·C)
    whatever M is; without autograd the kernel block is computed in place. ``kernel_out`` (N×M,
    no autograd): receives ``k(x̂, S)`` block by block, for a caller that needs the votes' parts
    (``svgen explain``) with scores that are these by construction.
    """
    support = support.reshape(-1, support.shape[-1])
    if (x.requires_grad or support.requires_grad or getattr(sigma, "requires_grad", False)) and torch.is_grad_enabled():
        out = None
        for start in range(0, support.shape[0], block_size):
            part = kernel(x, support[start:start + block_size], sigma, kind) @ vote_weights[start:start + block_size]
            out = part if out is None else out + part
        return out
    sigma = float(sigma)
    x = F.normalize(x, dim=-1)
    S = F.normalize(support, dim=-1)
    if not vote_weights.is_sparse:
        out = torch.zeros(x.shape[0], vote_weights.shape[1], dtype=x.dtype, device=x.device)
        for start in range(0, S.shape[0], block_size):
            part = None if kernel_out is None else kernel_out[:, start:start + block_size]
            kern = kernel_from_gram_(torch.mm(x, S[start:start + block_size].T, out=part), sigma, kind)
            out.addmm_(kern, vote_weights[start:start + block_size].to(kern.dtype))
        return out
    # Sparse votes: work transposed, so that both operands of the sparse product are row-major.
    # ``Aᵀ[:, block] (CSR) @ k(S_block, x̂)`` accumulated in place into ``scoresᵀ`` is ~2× faster
    # than ``(CSR @ kernᵀ)ᵀ`` on a transposed view plus a temporary per block (measured in
    # benchmarks/bench_scoring.py: 0.30× → 0.64× of GEMM at C = 21,843, N = 2,048).
    blocks = _csr_blocks(vote_weights, block_size)
    out_t = torch.zeros(vote_weights.shape[1], x.shape[0], dtype=x.dtype, device=x.device)
    for b, start in enumerate(range(0, S.shape[0], block_size)):
        kern_t = kernel_from_gram_(S[start:start + block_size] @ x.T, sigma, kind)
        out_t.addmm_(blocks[b].to(kern_t.dtype), kern_t)
        if kernel_out is not None:
            kernel_out[:, start:start + block_size].copy_(kern_t.T)
    return out_t.T.contiguous()


def topk(scores: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """(values, indices) of the k best classes per row, best first; equal scores in the lower class index first
    (as ``argmax`` picks), whatever ``k`` is. ``classify`` ranks with it and ``eval`` scores its top-k with it."""
    k = min(k, scores.shape[1])
    values, indices = torch.topk(scores, k, dim=1)   # torch.topk orders ties as it finds them
    if k == 0 or scores.shape[0] == 0:
        return values, indices
    tied = (scores >= values[:, -1:]).sum(dim=1) > k
    if k > 1:
        tied |= (values[:, 1:] == values[:, :-1]).any(dim=1)
    if bool(tied.any()):   # only rows with a tie among or at the edge of their top k are sorted again, stably
        rows = tied.nonzero().squeeze(1)
        v, i = torch.sort(scores[rows], dim=1, descending=True, stable=True)
        values[rows], indices[rows] = v[:, :k], i[:, :k]
    return values, indices

