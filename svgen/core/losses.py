"""The training objective: kernel-target alignment, a margin term, and grounding.

Support vectors are class-major: rows ``c*K .. c*K+K-1`` belong to class c. ``Y`` is the M×C
one-hot class indicator, so ``YYᵀ`` is block diagonal with C blocks of K×K ones.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kernel_alignment(K: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``A(K, YYᵀ) = <K, YYᵀ>_F / sqrt(<K, K>_F <YYᵀ, YYᵀ>_F)`` for integer ``labels`` (length M).

    ``<K, YYᵀ>`` is the sum of K over same-class pairs; ``<YYᵀ, YYᵀ> = Σ_c n_c²``.
    """
    same = labels[:, None] == labels[None, :]
    counts = torch.bincount(labels).to(K.dtype)
    return (K * same).sum() / torch.sqrt((K * K).sum() * (counts * counts).sum())


def alignment_from_sums(same_class_sum, fro_sq, class_sizes_sq_sum):
    """The same alignment from its three sums (for blocked / random-feature evaluation)."""
    return same_class_sum / torch.sqrt(fro_sq * class_sizes_sq_sum)


def block_alignment(K: torch.Tensor, n_classes: int, n_support: int) -> torch.Tensor:
    """:func:`kernel_alignment` for class-major rows with exactly ``n_support`` per class.

    The same-class term is the sum of the C diagonal K×K blocks; ``<YYᵀ,YYᵀ> = C·K²``.
    """
    blocks = K.reshape(n_classes, n_support, n_classes, n_support)
    same = torch.diagonal(blocks, dim1=0, dim2=2).sum()
    return alignment_from_sums(same, (K * K).sum(), torch.tensor(float(n_classes * n_support ** 2), dtype=K.dtype))


def multiclass_hinge(logits: torch.Tensor, labels: torch.Tensor, margin: float = 1.0) -> torch.Tensor:
    """Crammer–Singer hinge ``mean_i max(0, margin + max_{j≠y_i} z_ij - z_{i,y_i})``."""
    true = logits.gather(1, labels[:, None])
    others = logits.scatter(1, labels[:, None], float("-inf"))
    return F.relu(margin + others.max(dim=1, keepdim=True).values - true).mean()


def softmax_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Softmax cross-entropy ``mean_i -log softmax(z_i)_{y_i}``."""
    return F.cross_entropy(logits, labels)


MARGINS = {"hinge": multiclass_hinge, "ce": softmax_ce}


def grounding_loss(support: torch.Tensor, anchors: torch.Tensor) -> torch.Tensor:
    """``mean_{c,k} (1 - cos(s_{c,k}, a_{c,k}))``: each support vector stays near its own anchor,
    a text embedding of its class (``support`` and ``anchors`` B×K×D, unit rows)."""
    return (1.0 - (support * anchors).sum(dim=-1)).mean()


def rff_alignment_terms(phi: torch.Tensor, n_classes: int, n_support: int):
    """Alignment sums from random features (``K ≈ ΦΦᵀ``), never forming the M×M kernel.

    ``<K, YYᵀ> ≈ ||ΦᵀY||²_F`` and ``<K, K> ≈ ||ΦᵀΦ||²_F``; returns (same-class sum, Frobenius²).
    """
    per_class = phi.reshape(n_classes, n_support, -1).sum(dim=1)  # C×m = (ΦᵀY)ᵀ
    gram = phi.T @ phi
    return (per_class * per_class).sum(), (gram * gram).sum()

