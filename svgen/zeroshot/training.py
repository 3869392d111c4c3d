"""Training the support vector generator, then solving the vote weights.

One step on a batch of B classes (all classes when C is small):

    S      = g(P_batch, anchors)                      B·K support vectors, unit rows
    K_SS   = k(S, S; σ)
    loss   = - w_a · A(K_SS, YYᵀ)                      kernel-target alignment
             + w_m · hinge(S Wᵀ + b, y)               margin term of the linear head
             + w_g · grounding(S, E_batch)            stay near the class's own text embeddings
             + w_q · CE(k(E_q, S) A_θ, y_q)            optional: query loss through the KRR solve

Class batches mix random classes with their nearest neighbours (by prototype cosine), so
confusable classes meet in the same step and each step's memory does not depend on C.
After training, :func:`solve_vote_weights` computes ``A = (K_SS + M·λ·I)⁻¹ Y`` over all M = C·K
support vectors with λ chosen in closed form (leave-one-out or GCV) — no images anywhere.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from svgen.core.generator import SupportVectorGenerator, template_anchors
from svgen.core.ridge import DEFAULT_LAMBDAS, krr_vote_weights, one_hot_blocks, ridge_path_scores, top_eigenvalue
from svgen.core.kernels import kernel, median_heuristic
from svgen.config import FitConfig
from svgen.core.losses import MARGINS, block_alignment, grounding_loss
from svgen.core import scale
from svgen.core.metric import (confusion_directions, lda_head, metric_strength, nearest_classes, neighbour_difference_covariance,
                     neighbour_pairs, text_precision, whiten_directions, whitened_cosine_head)

log = logging.getLogger(__name__)


class ClassBatchSampler:
    """Batches of class indices: random seeds plus each seed's nearest neighbours by prototype cosine."""

    def __init__(self, prototypes: torch.Tensor, batch_classes: int, neighbours: int, seed: int):
        self.C = prototypes.shape[0]
        self.batch = min(batch_classes, self.C)
        self.neighbours = min(neighbours, self.C - 1)
        self.rng = np.random.default_rng(seed)
        self.nn = None
        if self.batch < self.C and self.neighbours > 0:
            self.nn = nearest_classes(prototypes, self.neighbours).numpy()

    def __call__(self) -> torch.Tensor:
        if self.batch >= self.C:
            return torch.arange(self.C)
        chosen, seen = [], set()
        while len(chosen) < self.batch:
            c = int(self.rng.integers(self.C))
            group = [c] + (list(self.nn[c]) if self.nn is not None else [])
            for g in group:
                if g not in seen and len(chosen) < self.batch:
                    seen.add(g)
                    chosen.append(int(g))
        return torch.tensor(sorted(chosen))


@dataclass
class TrainState:
    generator: SupportVectorGenerator
    log_sigma: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor
    history: Dict[str, list] = field(default_factory=dict)
    diverged_at: Optional[int] = None
    steps_done: int = 0
    sigma_init: float = float("nan")
    alignment_start: Optional[float] = float("nan")
    anchors: Optional[torch.Tensor] = None  # C×K×D starting points of the support vectors
    precision: Optional[torch.Tensor] = None  # Σ⁻¹ of the text metric (None: plain cosine geometry)
    geometry: Dict[str, object] = field(default_factory=dict)  # what setup_geometry decided, for svgen.json


def alignment_estimate(S: torch.Tensor, sigma: float, kind: str, seed: int = 0, max_classes: int = 2048) -> float:
    """Kernel-target alignment of C×K×D support vectors (over a random subset of classes if C is large),
    streamed in row blocks so memory stays O(block·M) (:func:`svgen.core.scale.alignment_value`)."""
    return scale.alignment_value(S, sigma, kind, max_classes=max_classes, seed=seed)[0]


def generate_all(generator, prototypes, anchors, chunk: int = 4096) -> torch.Tensor:
    """All C×K×D support vectors, in chunks of classes."""
    with torch.no_grad():
        return torch.cat([generator(prototypes[s:s + chunk], anchors[s:s + chunk]) for s in range(0, prototypes.shape[0], chunk)])


def _batch_loss(cfg: FitConfig, state: TrainState, P, anchors, E, idx, y_cache):
    B, K = len(idx), cfg.n_support
    S3 = state.generator(P[idx], anchors[idx])
    S = S3.reshape(B * K, -1)
    sigma = state.log_sigma.exp()
    plan = scale.plan_fit(cfg, P.shape[0], P.shape[1])
    if cfg.query_weight > 0:
        plan = dataclasses.replace(plan, alignment_path="exact")  # the query loss needs K_SS itself
    align, K_ss = scale.batch_alignment(S3, sigma, cfg.kernel, plan, seed=cfg.seed)
    labels = y_cache[: B * K] if B * K <= len(y_cache) else torch.arange(B).repeat_interleave(K)
    logits = S @ state.weight[idx].T + state.bias[idx]
    margin = MARGINS[cfg.margin](logits, labels)
    ground = grounding_loss(S3, anchors[idx])
    loss = -cfg.alignment_weight * align + cfg.margin_weight * margin + cfg.grounding_weight * ground
    parts = {"align": align, "margin": margin, "ground": ground}
    if cfg.query_weight > 0:
        Q = E[idx].reshape(-1, E.shape[-1])
        q_labels = torch.arange(B).repeat_interleave(E.shape[1])
        A = krr_vote_weights(K_ss, one_hot_blocks(B, K), cfg.query_ridge)
        scores = kernel(Q, S, sigma, cfg.kernel) @ A
        query = F.cross_entropy(scores / scores.std().clamp_min(1e-6), q_labels)
        loss = loss + cfg.query_weight * query
        parts["query"] = query
    return loss, parts


def setup_geometry(P: torch.Tensor, E: torch.Tensor, cfg: FitConfig):
    """(Σ⁻¹ or None, anchors C×K×D, decision dict) from the text embeddings alone.

    Anchors are template-group means (:func:`template_anchors`), pulled towards the prototype to
    ``normalize(p + ω (ḡ − p))`` with the metric's trust ``ω = r / T`` (:func:`metric_strength`:
    averaged prompts and few classes mean less trust in text-side deviations, and ω → 0 leaves the
    prototype alone, the cosine rule). When a class has fewer templates than K, the surplus slots
    are spread in ± pairs along the class-confusion directions around the class prototype
    (:func:`spread_anchors`), so the K support vectors of a class start apart while their mean
    direction stays the prototype. With the neighbour metric, anchors are then whitened
    and re-normalised, ``normalize(Σ⁻¹ a)`` (see :mod:`svgen.core.metric`); the metric's strength is
    decided by :func:`svgen.core.metric.metric_strength` and recorded.
    """
    cov = neighbour_difference_covariance(P)  # computed once for the spread and the metric
    decision = metric_strength(cfg.metric_condition, E.shape[1], neighbour_pairs(P), P.shape[1])
    groups = template_anchors(E, cfg.n_support)
    if E.shape[1] > 1:  # template groups trusted as far as the text geometry is: pulled towards the prototype
        w = decision["reliability"] / decision["templates_averaged"]
        groups = F.normalize(P[:, None, :] + w * (groups - P[:, None, :]), dim=-1)
    anchors = spread_anchors(groups, P, n_templates=E.shape[1], cov=cov)
    if cfg.metric == "none":
        return None, anchors, {"metric": "none", "kappa": 1.0, "linear_head": cfg.linear_head,
                               "reason": "metric switched off: plain cosine geometry"}
    decision = {"metric": cfg.metric, **decision, "linear_head": cfg.linear_head}
    precision = text_precision(P, decision["kappa"], cov=cov).to(P.device)
    return precision, whiten_directions(anchors, precision), decision


def spread_anchors(anchors: torch.Tensor, P: torch.Tensor, n_templates: int,
                   cov: Optional[torch.Tensor] = None, centres: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Fill the anchor slots that templates cannot fill in ± pairs around the class prototype.

    With T ≥ 2 templates, slots k < T keep their template-group means and the surplus slots
    k ≥ T are filled; with one template every slot is (the group mean *is* the prototype, and K
    copies of it would make K_SS singular). Free slot ``2j`` is ``normalize(p + θ u_j)``, slot
    ``2j + 1`` is ``normalize(p − θ u_j)``, and an odd last free slot is ``p`` itself. ``u_j`` is
    ``v_j`` projected onto the tangent plane of ``p`` (unit length), ``v_j`` the top eigenvectors
    of the neighbour-difference covariance (the directions in which confusable classes differ),
    and ``θ`` is half the median nearest-prototype distance over ``√T`` (the prompt noise that the
    spread tolerates shrinks like ``1/√T`` when T prompts are averaged), so the spread stays
    inside each class's own neighbourhood. The pairs are symmetric, so the free anchors average to the
    prototype direction: the cosine prototype is never lost, and θ → 0 recovers it.
    ``P``: the prototypes that define the directions (all classes of the artifact); ``cov``:
    their neighbour-difference covariance if already computed; ``centres``: the prototypes of the
    rows of ``anchors`` (default: ``P``, when they are the same classes).
    """
    C, K, D = anchors.shape
    keep = n_templates if n_templates > 1 else 0
    extra = K - keep
    if extra <= 0:
        return anchors
    centre = F.normalize((P if centres is None else centres).to(anchors.dtype), dim=-1)
    dirs, theta = confusion_directions(P, max(extra // 2, 1), cov=cov)
    theta = theta / math.sqrt(max(n_templates, 1))  # averaged prompts: their spread shrinks like 1/√T
    out = anchors.clone()
    for i in range(extra):
        slot = keep + i
        if i // 2 >= extra // 2:  # odd number of free slots: the prototype itself
            out[:, slot] = centre
            continue
        sign = 1.0 if i % 2 == 0 else -1.0
        v = dirs[i // 2].to(anchors.dtype)
        tangent = F.normalize(v - (centre @ v)[:, None] * centre, dim=-1)  # v projected onto each class's tangent plane
        out[:, slot] = F.normalize(centre + sign * theta * tangent, dim=-1)
    return out


def initial_linear_head(P: torch.Tensor, precision: Optional[torch.Tensor], scale: float, kind: str = "whitened"):
    """W, b of the closed-form linear head, rows rescaled to mean norm ``scale`` (no ranking changes).

    ``whitened`` (default): ``normalize(Σ⁻¹ p_c)``, zero bias (:func:`whitened_cosine_head`);
    without a metric it is ``p̂_c``, the cosine rule. ``lda``: Fisher's LDA under the metric.
    """
    if kind == "lda" and precision is not None:
        W, b = lda_head(P, precision)
    else:
        W, b = whitened_cosine_head(P, precision)
    beta = scale / W.norm(dim=1).mean()
    return beta * W, beta * b


def train_generator(
    P: torch.Tensor, E: torch.Tensor, cfg: FitConfig, progress: bool = False, device: Optional[torch.device] = None
) -> TrainState:
    """Run ``cfg.steps`` optimisation steps; returns the trained state (restored on divergence)."""
    device = device or torch.device("cpu")
    torch.manual_seed(cfg.seed)
    C, D = P.shape
    P, E = P.to(device), E.to(device)
    precision, anchors, geometry = setup_geometry(P, E, cfg)
    queries = E if precision is None else whiten_directions(E, precision)  # text queries for query_weight > 0
    generator = SupportVectorGenerator(D, cfg.n_support, radius=cfg.radius).to(device)
    if cfg.steps == 0:  # no training: the support vectors are the anchors, not anchors plus random init noise
        with torch.no_grad():
            generator.net[2].weight.zero_()
            generator.net[2].bias.zero_()
    S0 = generate_all(generator, P, anchors)
    sigma0 = median_heuristic(S0) or median_heuristic(P) or 1.0
    weight, bias = initial_linear_head(P, precision, cfg.linear_init_scale, cfg.linear_head)
    state = TrainState(
        generator=generator,
        log_sigma=torch.tensor(math.log(sigma0), device=device, requires_grad=cfg.learn_sigma),
        weight=weight.to(device).requires_grad_(True),
        bias=bias.to(device).requires_grad_(True),
        history={"loss": [], "align": [], "margin": [], "ground": [], "sigma": []},
        sigma_init=sigma0,
        # steps == 0: the start is the end, measured once by fit_metrics (exactly, on K_SS)
        alignment_start=alignment_estimate(S0, sigma0, cfg.kernel, cfg.seed) if cfg.steps else None,
        anchors=anchors,
        precision=precision,
        geometry=geometry,
    )
    params = list(generator.parameters()) + ([state.log_sigma] if cfg.learn_sigma else [])
    groups = [{"params": params, "lr": cfg.lr}]
    if cfg.head_lr > 0:
        groups.append({"params": [state.weight, state.bias], "lr": cfg.head_lr})
        params = params + [state.weight, state.bias]
    else:  # the closed-form head stays fixed; the margin term shapes the support vectors only
        state.weight.requires_grad_(False)
        state.bias.requires_grad_(False)
    if cfg.steps == 0:  # nothing to optimise: no optimiser (building Adam imports torch._dynamo, seconds)
        return state
    opt = torch.optim.Adam(groups)
    sampler = ClassBatchSampler(P, cfg.batch_classes, cfg.neighbours, cfg.seed)
    y_cache = torch.arange(min(C, cfg.batch_classes)).repeat_interleave(cfg.n_support).to(device)

    steps = range(cfg.steps)
    bar = None
    if progress and cfg.steps:
        from tqdm.auto import tqdm

        bar = tqdm(steps, desc="fitting", unit="step")
        steps = bar
    good = _snapshot(state)
    for step in steps:
        idx = sampler().to(device)
        loss, parts = _batch_loss(cfg, state, P, anchors, queries, idx, y_cache)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grads_ok = all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
        if not (torch.isfinite(loss) and grads_ok):
            state.diverged_at = step
            _restore(state, good)
            log.warning("training diverged at step %d (non-finite loss or gradient); "
                        "restored the state of step %d and stopped", step, max(step - 1, 0))
            break
        opt.step()
        if not all(torch.isfinite(p).all() for p in params):
            state.diverged_at = step
            _restore(state, good)
            log.warning("training diverged at step %d (non-finite parameters); restored the last good state and stopped", step)
            break
        good = _snapshot(state)
        state.steps_done = step + 1
        sigma = float(state.log_sigma.detach().exp())
        h = state.history
        h["loss"].append(float(loss.detach())); h["sigma"].append(sigma)
        for k in ("align", "margin", "ground"):
            h[k].append(float(parts[k].detach()))
        if bar is not None:
            bar.set_postfix(loss=f"{h['loss'][-1]:.4f}", align=f"{h['align'][-1]:.4f}", sigma=f"{sigma:.3f}")
    if bar is not None:
        bar.close()
    return state


def _snapshot(state: TrainState):
    return (copy.deepcopy(state.generator.state_dict()), state.log_sigma.detach().clone(),
            state.weight.detach().clone(), state.bias.detach().clone())


def _restore(state: TrainState, snap) -> None:
    gen, log_sigma, weight, bias = snap
    state.generator.load_state_dict(gen)
    with torch.no_grad():
        state.log_sigma.copy_(log_sigma)
        state.weight.copy_(weight)
        state.bias.copy_(bias)


def choose_ridge(K_ss: torch.Tensor, Y: torch.Tensor, ridge, lambdas=DEFAULT_LAMBDAS, parzen_factor: float = 100.0):
    """λ for ``A = (K_SS + M·λ·I)⁻¹ Y``: a given number; ``auto``; or closed-form LOO / GCV.

    ``auto`` sets ``M·λ = parzen_factor · λ_max(K_SS)``: the solve stays in its Parzen-window
    regime (``A ≈ Y/(Mλ)`` with ≤ 1/parzen_factor decorrelation). Text-to-text kernel geometry
    does not carry across CLIP's image–text modality gap, so LOO / GCV over the support vectors
    pick small λ that decorrelate along text directions and lose accuracy on images
    (docs/accuracy.md measures all three).
    """
    if not isinstance(ridge, str):
        return float(ridge), {}
    if ridge == "auto":
        return parzen_factor * top_eigenvalue(K_ss) / K_ss.shape[0], {}
    scores, lams = ridge_path_scores(K_ss, Y, list(lambdas), criterion=ridge)
    best = min(range(len(lams)), key=lambda i: (scores[i], -lams[i]))
    return float(lams[best]), {f"{lam:g}": s for lam, s in zip(lams, scores)}


RIDGE_SUBSET_CLASSES = 1024  # λ selection for large M runs on this many random classes


def solve_vote_weights(S: torch.Tensor, sigma: float, cfg: FitConfig, n_classes: int):
    """(A, λ, K_SS or None, selection scores): KRR vote weights over all C·K support vectors.

    Ordinary sizes: one dense float64 Cholesky, A dense M×C. Large M (:func:`svgen.core.scale.plan_fit`):
    λ is chosen on a random subset of classes (it is in the ``M·λ`` convention, so it transfers) and
    A is a sparse COO matrix solved class by class on neighbourhoods
    (:func:`svgen.core.scale.local_vote_weights`); K_SS is never formed and None is returned for it.
    """
    plan = scale.plan_fit(cfg, n_classes, S.shape[-1])
    if plan.vote_solver == "dense":
        # --ridge auto puts M·λ at parzen_factor·λ_max(K_SS), so cond(K_SS + M·λ·I) ≤ 1 + 1/parzen_factor:
        # float32 solves it to float32 accuracy (A is stored in float32), in half the time of float64.
        # A chosen λ (loo/gcv, or a number) may be small: float64.
        wide = cfg.ridge == "auto" and cfg.parzen_factor >= 1
        flat = S.reshape(-1, S.shape[-1]).to(torch.float32 if wide else torch.float64)
        K_ss = kernel(flat, flat, sigma, cfg.kernel)
        Y = one_hot_blocks(n_classes, cfg.n_support, dtype=flat.dtype)
        lam, path = choose_ridge(K_ss, Y, cfg.ridge, parzen_factor=cfg.parzen_factor)
        A = krr_vote_weights(K_ss, Y, lam)
        return A.float(), lam, K_ss, path
    sub = scale.subset_classes(n_classes, RIDGE_SUBSET_CLASSES, cfg.seed)
    S_sub = S if sub is None else S[sub]
    flat = S_sub.reshape(-1, S.shape[-1]).double()
    lam, path = choose_ridge(kernel(flat, flat, sigma, cfg.kernel),
                             one_hot_blocks(S_sub.shape[0], cfg.n_support, dtype=torch.float64),
                             cfg.ridge, parzen_factor=cfg.parzen_factor)
    del flat
    t0 = time.perf_counter()
    A = scale.local_vote_weights(S, sigma, cfg.kernel, lam, plan.vote_neighbours)
    log.info("local vote weights: %d classes × %d neighbours, nnz=%d, %.1fs", n_classes, plan.vote_neighbours,
             A._nnz(), time.perf_counter() - t0)
    return A, lam, None, path


VOTE_RESIDUAL_WARN = 0.05  # above this relative residual the sparse vote weights are not the KRR solution
HINGE_MAX_ROWS = 8192  # above this many support vectors the recorded hinge is a random-row estimate


def _hinge_chunked(flat, labels, weight, bias, chunk: int = 2048) -> float:
    """Mean multi-class hinge of the linear head on the support vectors, in row chunks (M×C can be GBs)."""
    total = 0.0
    for s in range(0, flat.shape[0], chunk):
        z = flat[s:s + chunk] @ weight.T + bias
        total += float(MARGINS["hinge"](z, labels[s:s + chunk])) * z.shape[0]
    return total / flat.shape[0]


FIT_CONDITION_ROWS = 1024  # the fit's own condition number: exact eigenvalues of at most this many rows


def fit_metrics(state: TrainState, S, P, K_ss, lam, cfg: FitConfig, wall_s: float, vote_weights=None) -> dict:
    """What ``svgen.json`` records about a fit.

    For large M (no K_SS) the alignment and condition number are estimated on a random subset of
    classes, and ``*_method`` / ``*_classes`` keys say so; ``scale`` records how the fit scaled.
    """
    C, K = S.shape[0], S.shape[1]
    flat = S.reshape(-1, S.shape[-1])
    labels = torch.arange(C).repeat_interleave(K)
    sigma = float(state.log_sigma.detach().exp())
    plan = scale.plan_fit(cfg, C, S.shape[-1])
    extra = {"scale": plan.as_dict()}
    with torch.no_grad():
        if K_ss is not None:
            align_end, align_classes = float(block_alignment(K_ss, C, K)), C
        else:
            align_end, align_classes = scale.alignment_value(S, sigma, cfg.kernel, seed=cfg.seed)
        rows = scale.subset_classes(flat.shape[0], HINGE_MAX_ROWS, cfg.seed)  # O(M·C·D) in full: sample rows
        if rows is not None:
            extra["hinge_rows"] = HINGE_MAX_ROWS
        hinge = _hinge_chunked(flat if rows is None else flat[rows], labels if rows is None else labels[rows],
                               state.weight.detach(), state.bias.detach())
        # exact on K_SS up to FIT_CONDITION_ROWS rows; above, exact on a random principal submatrix
        # (a lower bound, said in condition_number_method): `svgen diagnose` measures the full one
        small = K_ss is not None and K_ss.shape[0] <= FIT_CONDITION_ROWS
        cond = scale.condition_estimate(S, sigma, cfg.kernel, K_ss=K_ss if small else None, seed=cfg.seed,
                                        max_classes=max(1, FIT_CONDITION_ROWS // K))
        cos_proto = float(torch.einsum("ckd,cd->ck", S, F.normalize(P, dim=-1)).mean())
        if vote_weights is not None and vote_weights.is_sparse:
            extra["vote_weights"] = {**scale.sparse_layout(vote_weights), "solver": plan.vote_solver,
                                     "neighbours": plan.vote_neighbours,
                                     "relative_residual": scale.vote_residual(S, sigma, cfg.kernel, lam, vote_weights,
                                                                              seed=cfg.seed),
                                     "residual_columns": min(8, C)}
            res = extra["vote_weights"]["relative_residual"]
            if res > VOTE_RESIDUAL_WARN:
                log.warning("sparse vote weights solve (K_SS + M·λ·I) A = Y only to a relative residual of %.3g "
                            "(λ = %.3g): the neighbourhood solve needs the large ridge of --ridge auto, or more "
                            "--vote-neighbours", res, lam)
    return {
        "alignment_start": align_end if state.alignment_start is None else state.alignment_start,
        "alignment_end": align_end,
        "alignment_classes": align_classes,
        "hinge": hinge,
        "condition_number": cond["value"],
        "condition_number_method": cond["method"],
        "condition_number_classes": cond["classes"],
        "mean_cos_support_prototype": cos_proto,
        "ridge_lambda": lam,
        "sigma_init": state.sigma_init,
        "sigma": sigma,
        "steps_done": state.steps_done,
        "diverged_at_step": state.diverged_at,
        "wall_time_s": wall_s,
        "geometry": dict(state.geometry),
        **extra,
    }
