"""The zero-shot fit, start to end: text prototypes → generator → support vectors → vote weights → temperatures.

:func:`fit_zero_shot` returns the whole zero-shot stage as plain objects (:class:`ZeroShotFit`); the steps are
:mod:`svgen.zeroshot.training` (the generator and the vote solve) and :func:`svgen.heads.predictor.text_calibration`
(the temperatures, from the text side).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Optional

import torch

from svgen.adapt.config import AdaptConfig
from svgen.errors import SvgenError
from svgen.heads import predictor
from svgen.state import Heads, KernelHead, LinearHead
from svgen.steps import timed
from svgen.zeroshot.training import fit_metrics, generate_all, solve_vote_weights, train_generator

log = logging.getLogger(__name__)


def scale_votes(votes: torch.Tensor, rows: torch.Tensor, lam) -> tuple:
    """(votes × M·λ, the record): in the Parzen regime ``(K + M·λ·I)⁻¹ ≈ I/(M·λ)`` (M support vectors), so a score
    ≈ the summed kernel mass of the class's own support vectors instead of a number like 2e-05. A positive
    factor: no ranking changes."""
    M = rows.reshape(-1, rows.shape[-1]).shape[0]
    factor = float(M * lam) if lam else 1.0
    return votes * factor, {"factor": factor, "rule": "M·λ"}


@dataclass
class ZeroShotFit:
    """Everything a zero-shot fit produces: calibrated heads and what they were made with."""

    heads: Heads
    generator: torch.nn.Module
    precision: Optional[torch.Tensor]
    history: list
    metrics: dict
    ridge_lambda: float
    vote_scale: dict


def fit_zero_shot(P: torch.Tensor, E: torch.Tensor, cfg, t0: float, adapt: AdaptConfig,
                  progress: bool = False) -> ZeroShotFit:
    """Fit from unit prototypes ``P`` (C×D) and per-template embeddings ``E`` (C×T×D) with the settings ``cfg``
    (:class:`svgen.config.FitConfig`); ``t0``: when the fit began (``metrics.wall_time_s`` covers it all);
    ``adapt``: the model's :class:`~svgen.adapt.config.AdaptConfig` (the text temperatures' query sizes)."""
    C, D = P.shape
    if cfg.n_support > 2 * D:   # a class's support vectors spread in ± pairs along at most D directions
        raise SvgenError(f"n_support (support vectors per class) must be <= 2 × the embedding dimension ({2 * D} "
                         f"here), got {cfg.n_support}",
                         cli=f"-K (support vectors per class) must be <= 2 × the embedding dimension ({2 * D} here), "
                             f"got {cfg.n_support}")
    with timed(log, "fit: support vector generator") as info:
        state = train_generator(P, E, cfg, progress=progress)
        S = generate_all(state.generator, P, state.anchors)
        info += [f"{C} classes × K={cfg.n_support}, {state.steps_done} of {cfg.steps} step(s)"]
    sigma = float(state.log_sigma.detach().exp())
    with timed(log, "fit: vote weights") as info:
        A, lam, K_ss, path = solve_vote_weights(S, sigma, cfg, C)
        info += [f"{'sparse' if A.is_sparse else 'dense'}, M={C * cfg.n_support}, σ={sigma:.3g}, λ={lam:.3g}"]
    with timed(log, "fit: metrics"):
        metrics = fit_metrics(state, S, P, K_ss, lam, cfg, time.perf_counter() - t0, vote_weights=A)
    metrics["ridge_selection"] = path
    votes, vote_scale = scale_votes(A, S, lam)
    heads = Heads(KernelHead(S, sigma, votes), LinearHead(state.weight.detach().clone(), state.bias.detach().clone()))
    with timed(log, "fit: temperatures from the text side"):
        heads.calibration = predictor.text_calibration(heads, P, E, cfg.kernel, adapt)
    metrics["wall_time_s"] = time.perf_counter() - t0
    return ZeroShotFit(heads, state.generator.eval().requires_grad_(False), state.precision, state.history, metrics,
                       lam, vote_scale)
