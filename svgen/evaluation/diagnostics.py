"""The troubleshooting table, automated: what is wrong with a kernel over support vectors.

From ``K_SS`` (over all support vectors, or a random subset of classes when there are many):

==========================  =====================================  ==========================
symptom                     measured as                            likely cause
==========================  =====================================  ==========================
near-identity kernel        mean off-diagonal k < 0.01             σ too small / unnormalised
near-constant kernel        std of off-diagonal k < 0.01·mean      σ too large
clumped support vectors     mean within-class cos > 0.999 (K>1)    margin term missing / weak
ill-conditioned kernel      cond(K_SS) > 1e8                       margin term too strong
duplicate classes           two prototypes with cos ≥ 0.9999        same name up to case/space
==========================  =====================================  ==========================

Duplicate classes come first: their support vectors coincide, which alone makes ``K_SS``
singular and the two classes' scores tie, so the other findings then name them as the cause
instead of the margin term.

plus the spectrum, its effective rank (``exp`` of the eigenvalue entropy) and the kernel-target
alignment.
"""

from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional, Sequence

import torch

from svgen.core.kernels import kernel
from svgen.core.losses import block_alignment
from svgen.heads.scoring import MIXTURE
from svgen.state import Evidence, PoolOutcome, ShotsOutcome
from svgen.steps import Clock

log = logging.getLogger(__name__)

NEAR_IDENTITY = 0.01
NEAR_CONSTANT = 0.01
CLUMPED = 0.999
ILL_CONDITIONED = 1e8


def effective_rank(eigvals: torch.Tensor) -> float:
    """``exp(entropy(λ/Σλ))`` of a PSD spectrum (Roy & Vetterli 2007): 1 for rank one, n for λ ∝ 1."""
    lam = eigvals.double().clamp_min(0)
    p = lam / lam.sum()
    p = p[p > 0]
    return float(math.exp(float(-(p * p.log()).sum())))


def diagnose(support: torch.Tensor, sigma: float, kind: str = "rbf", max_classes: int = 1024, seed: int = 0,
             prototypes: Optional[torch.Tensor] = None, classes: Optional[Sequence[str]] = None) -> Dict:
    """Measurements and findings for C×K×D support vectors (a class subset when C is large).

    With ``prototypes`` (C×D) and ``classes``, all pairs of classes whose prototypes coincide
    are listed under ``duplicate_classes`` as ``[name, name, cos]``.
    """
    clock = Clock(log)
    duplicates = []
    if prototypes is not None:
        from svgen.validation import duplicate_prototypes

        names = list(classes) if classes is not None else [f"class_{i}" for i in range(prototypes.shape[0])]
        duplicates = [[names[i], names[j], c] for i, j, c in duplicate_prototypes(prototypes)]
        clock.lap("diagnose: coinciding prototypes (%d classes)", prototypes.shape[0])
    C, K, D = support.shape
    subset = C > max_classes
    if subset:
        idx = torch.randperm(C, generator=torch.Generator().manual_seed(seed))[:max_classes]
        support = support[idx]
        C = max_classes
    flat = support.reshape(C * K, D).double()
    K_ss = kernel(flat, flat, sigma, kind)
    M = K_ss.shape[0]
    off = K_ss[~torch.eye(M, dtype=torch.bool)]
    clock.lap("diagnose: kernel matrix K_SS (%d×%d, %d classes)", M, M, C)
    eig = torch.linalg.eigvalsh(K_ss)
    clock.lap("diagnose: spectrum of K_SS")
    cond = float(eig[-1] / eig[0]) if eig[0] > 0 else float("inf")
    within = None
    if K > 1:
        cos = torch.einsum("ckd,cjd->ckj", support.double(), support.double())
        within = float(((cos.sum(dim=(1, 2)) - K) / (K * K - K)).mean())
    report = {
        "classes_measured": C,
        "subset": subset,
        "n_support": K,
        "sigma": float(sigma),
        "kernel": kind,
        "alignment": float(block_alignment(K_ss, C, K)),
        "offdiag_mean": float(off.mean()),
        "offdiag_std": float(off.std()),
        "condition_number": cond,
        "effective_rank": effective_rank(eig),
        "eigenvalues_top": [float(v) for v in eig.flip(0)[:10]],
        "within_class_cos": within,
        "duplicate_classes": duplicates,
    }
    clock.lap("diagnose: alignment, spread and rank")
    report["findings"] = findings(report)
    report["spectrum"] = eig.flip(0)
    return report


def findings(r: Dict) -> List[str]:
    """Plain-language findings from :func:`diagnose`'s measurements (empty: nothing wrong)."""
    from svgen.encoders.prototypes import short_name

    out = []
    dup = r.get("duplicate_classes") or []
    if dup:
        shown = "; ".join(f"{short_name(a)} and {short_name(b)} (cos {c:.6f})" for a, b, c in dup[:5])
        out.append(f"duplicate classes: {len(dup)} pair(s) have identical or near-identical prototypes — {shown}"
                   f"{' …' if len(dup) > 5 else ''}. Their support vectors coincide, so their scores tie and K_SS is "
                   "singular; names that differ only in case or spacing encode alike. Remove or rename one of each "
                   "pair and fit again")
    if r["offdiag_mean"] < NEAR_IDENTITY:
        out.append(f"near-identity kernel (mean off-diagonal {r['offdiag_mean']:.2g}): σ={r['sigma']:.3g} is too "
                   "small or features are not normalised; every point is only similar to itself")
    elif r["offdiag_std"] < NEAR_CONSTANT * max(r["offdiag_mean"], 1e-12):
        out.append(f"near-constant kernel (off-diagonal {r['offdiag_mean']:.3g} ± {r['offdiag_std']:.2g}): "
                   f"σ={r['sigma']:.3g} is too large; the kernel cannot tell classes apart")
    if r["within_class_cos"] is not None and r["within_class_cos"] > CLUMPED:
        out.append(f"clumped support vectors (mean within-class cos {r['within_class_cos']:.4f}): the K vectors of a "
                   "class coincide; the margin term is missing or too weak")
    if not r["condition_number"] < ILL_CONDITIONED:
        cause = ("the duplicate classes above: their support vectors coincide" if dup else
                 "the margin term may be too strong, or support vectors nearly coincide")
        out.append(f"ill-conditioned kernel (condition number {r['condition_number']:.3g}): {cause}; "
                   "the ridge λ keeps the vote solve stable")
    return out


def deployed_kernel(meta: Dict, tensors: Dict) -> Optional[Dict]:
    """The kernel head ``classify`` uses, when images changed it (``svgen adapt``), else None.

    ``rows_by_source`` counts the support rows by where they came from (text, image, pool); ``sigma``
    is the deployed bandwidth and ``text_sigma`` the generated text kernel's (what :func:`diagnose`
    measures); ``fewshot`` / ``transductive`` say what the adaptation chose, from ``svgen.json``.
    """
    from svgen.core.support import SOURCES

    fs, td = meta.get("fewshot") or {}, meta.get("transductive") or {}
    src = tensors.get("support_source")
    if src is None and not fs and not td:
        return None
    sigma = float(tensors["bandwidth"])
    if src is None:
        rows = {"text": int(tensors["support_vectors"].reshape(-1, tensors["support_vectors"].shape[-1]).shape[0])}
    else:
        rows = {name: int((src == i).sum()) for i, name in enumerate(SOURCES) if int((src == i).sum())}
    out = {"rows": sum(rows.values()), "rows_by_source": rows, "sigma": sigma,
           "text_sigma": float(tensors.get("text.bandwidth", sigma))}
    if fs:
        k, lin = fs.get("kernel") or {}, fs.get("linear") or {}
        dec = k.get("decision") or {}
        out["fewshot"] = {"shots": fs.get("shots"), "classes_with_shots": fs.get("classes_with_shots"),
                          "kernel": {"sigma": k.get("sigma"), "ridge_c": k.get("ridge_c"),
                                     "adapted": dec.get("adopted"), "rule": (k.get("selection") or {}).get("rule")},
                          "linear": {n: lin.get(n) for n in ("kind", "shrinkage", "loo_error", "form", "alpha")},
                          "default_head": fs.get("default_head"),
                          # where some classes have no shots the weight was fitted again with their tilt
                          "mixture_weight": ((fs.get("classes_without_shots") or {}).get("mixture_weight",
                                             (fs.get("head_choice") or {}).get("mixture_weight"))),
                          "classes_without_shots": {n: (fs.get("classes_without_shots") or {}).get(n)
                                                    for n in ("classes_without_shots", "offset")}}
        if k.get("prior_weight") is not None:   # format 2 (before the residual head): its own record
            out["fewshot"]["kernel"].update({n: k.get(n) for n in ("ridge_lambda", "prior_weight", "loo_error")})
    if td:
        kh = td.get("kernel_head") or {}
        check = td.get("check") or {}
        out["transductive"] = {"pool": td.get("pool"), "fallback": td.get("fallback"),
                               "prior_strength": td.get("prior_strength"), "rounds": td.get("rounds"),
                               "kernel_replaced": kh.get("replaced"), "kernel_reason": kh.get("reason"),
                               "evidence": check.get("evidence"), "default_head": td.get("default_head"),
                               "linear": (td.get("heads") or {}).get("linear"),
                               "pool_factor": (td.get("pool_factor") or {}).get("powers")}
    return out


def describe_deployed(d: Dict, shots: Optional[ShotsOutcome] = None, pool: Optional[PoolOutcome] = None) -> List[str]:
    """Plain lines for :func:`deployed_kernel`'s dict (``svgen diagnose``); what the shots and the pool decided is
    typed (``shots``, ``pool``: :mod:`svgen.io.recorded` maps an artifact's records to them), the dict's words are
    shown."""
    rows = ", ".join(f"{n} {c}" for n, c in d["rows_by_source"].items())
    lines = [f"deployed kernel head: {d['rows']} support rows ({rows}), σ={d['sigma']:.4g} "
             f"(the generated text kernel measured above: σ={d['text_sigma']:.4g})"]
    fs = d.get("fewshot")
    if fs:
        k, lin, default = fs["kernel"], fs["linear"], shots.default_head if shots is not None else "kernel"
        lam = f", λ={k['ridge_lambda']:.4g}" if k.get("ridge_lambda") is not None else ""
        c = f", c={k['ridge_c']:.4g}" if k.get("ridge_c") is not None else ""
        prior = f", text prior weight {k['prior_weight']:.3g}" if k.get("prior_weight") is not None else ""
        kept = {True: "; the shots' correction kept", False: "; the shots' correction refused (zero-shot kept)"}.get(
            k.get("adapted"), "")
        lines.append(f"  chosen by adapt from {fs['shots']} shot(s) in {fs['classes_with_shots']} class(es): kernel "
                     f"σ={k['sigma']:.4g}{c}{lam}{prior}{kept} ({k.get('rule')}); linear head "
                     + (f"zero-shot logits + {lin['alpha']:g}·LDA logits" if lin.get("alpha") is not None
                        else f"{lin.get('kind')}")
                     + (f", shrinkage {lin['shrinkage']:.3g}" if lin.get("shrinkage") is not None else "")
                     + f"; default head: {default}"
                     + (f" (w = {fs['mixture_weight']:.3g} × the kernel head's probabilities + {1 - fs['mixture_weight']:.3g}"
                        " × the linear head's)" if default == MIXTURE else ""))
        tilt = fs.get("classes_without_shots") or {}
        if tilt.get("offset"):
            lines.append(f"  the {tilt['classes_without_shots']} classes without shots: the mixture's probabilities of "
                         f"them × e^{tilt['offset']:.3g}, renormalised (the weight and the factor fitted together on refits "
                         "without groups of the classes with shots)")
    td = d.get("transductive")
    if td and pool is not None:
        if not pool.kept:
            lines.append(f"  transductive pool of {td['pool']}: nothing changed ({td['fallback']})")
        else:
            factor = td.get("pool_factor") or {}
            kept = ("re-solved with pool rows" if td.get("kernel_replaced")   # format 2 artifacts
                    else f"× the pool's class likelihood^{factor['kernel']:.3g}" if "kernel" in factor
                    else "kept as it was") + (f" ({td['kernel_reason']})" if td.get("kernel_reason") else "")
            why = f"kept on {pool.evidence.value}; " if pool.evidence is not None else ""
            head = f"; default head: {pool.default_head}" if pool.default_head else ""
            changed = (f"linear head {td.get('linear') or 're-solved'}; kernel vote {kept}"
                       if not factor or pool.evidence is Evidence.HALVES
                       else "× the pool's class likelihood to a power: " + ", ".join(
                           f"{h} head^{a:.3g}" for h, a in factor.items()) + "; the other heads as they were")
            lines.append(f"  transductive pool of {td['pool']} ({why}{td.get('rounds')} round(s), prior strength "
                         f"{td.get('prior_strength', 0):.3g}): {changed}{head}")
    return lines
