"""The support vector generator: one shared MLP that expands a prototype into K support vectors.

``s_{c,k} = normalize(a_{c,k} + ρ · tanh(||h_k||) · h_k / ||h_k||)``, ``h = g(p_c)`` with
``g: D → 2D → K·D`` (GELU).

* ``a_{c,k}`` is the k-th *anchor* of class c: a mean over a group of the class's per-template
  embeddings (templates are dealt round-robin into K groups), or the prototype itself when the
  class has a single template. Support vectors therefore start at real text embeddings of their
  own class, never at random points.
* ``ρ`` bounds how far the MLP can move a support vector from its anchor: the residual's norm
  is squashed by tanh below ρ (a per-coordinate tanh would allow ρ·√D), so a support vector
  stays within about ρ radians of its anchor; the result is projected onto the unit sphere.
* The last layer starts small (not zero) so the K vectors of a single-template class can separate.

The generator is shared by all classes, so a new class needs nothing but its prototype (and
templates): that is what makes ``add-classes`` free.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F


def template_anchors(per_template: torch.Tensor, n_support: int) -> torch.Tensor:
    """C×K×D anchors: template t goes to group ``t mod K``; each group's mean, normalised.

    With fewer templates than K, groups cycle over the templates (anchor k = template k mod T).
    """
    C, T, D = per_template.shape
    groups = []
    for k in range(n_support):
        members = list(range(k, T, n_support)) or [k % T]
        groups.append(per_template[:, members].mean(dim=1))
    return F.normalize(torch.stack(groups, dim=1), dim=-1)


class SupportVectorGenerator(nn.Module):
    """``D → 2D → K·D`` MLP with GELU; bounded residual around anchors; unit-norm outputs."""

    def __init__(self, dim: int, n_support: int, radius: float = 0.5, init_scale: float = 0.01, seed: Optional[int] = None):
        super().__init__()
        if n_support < 1:
            raise ValueError(f"n_support must be >= 1, got {n_support}")
        self.dim, self.n_support, self.radius = dim, n_support, radius
        if seed is not None:
            torch.manual_seed(seed)
        self.net = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, n_support * dim))
        with torch.no_grad():
            self.net[2].weight.mul_(init_scale)
            self.net[2].bias.zero_()

    def forward(self, prototypes: torch.Tensor, anchors: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Support vectors B×K×D from prototypes B×D (and anchors B×K×D, default: the prototypes)."""
        B = prototypes.shape[0]
        if anchors is None:
            anchors = prototypes[:, None, :].expand(B, self.n_support, self.dim)
        h = self.net(prototypes).view(B, self.n_support, self.dim)
        norm = h.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        delta = self.radius * torch.tanh(norm) * h / norm  # ||delta|| < radius: a trust region
        return F.normalize(anchors + delta, dim=-1)


def prototypes_from_embeddings(emb: torch.Tensor) -> tuple:
    """(per_template C×T×D, mean C×D) from raw C×D or C×T×D embeddings, all rows L2-normalised."""
    emb = torch.as_tensor(emb, dtype=torch.float32)
    if emb.dim() == 2:
        emb = emb[:, None, :]
    per_template = F.normalize(emb, dim=-1)
    return per_template, F.normalize(per_template.mean(dim=1), dim=-1)
