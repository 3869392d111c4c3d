"""Why an input got its label: each explained score split into exact parts that add up to it, and the support vectors
that voted for and against it, named by where they came from (``svgen explain``, ``SVGClassifier.explain``).

The score is the one ``classify`` prints for the head (:func:`svgen.heads.predictor.scores`); its parts, per head:

* kernel: ``prior`` (the zero-shot term ``softmax(τ·x̂P̂ᵀ)_c`` of an adapted head) + ``votes``, the sum over the
  support vectors s of ``k(x̂, s)·A[s, c]``, each of which is a contribution;
* linear: with shots ``cosine`` (``100·x̂p̂_cᵀ``) + ``shots`` (``α·s`` × the LDA logits, the rest of ``x̂W_cᵀ + b_c``);
  otherwise ``weight`` (``x̂W_cᵀ``) + ``bias``;
* cosine: ``cosine``;
* mixture: ``mixture``, ``log(w·p_kernel + (1 − w)·p_linear)``, + ``tilt`` (``δ − log Z`` for the classes without
  shots, ``−log Z`` for the others, where the fit tilted them) + ``floor`` (where ``10⁻³⁰`` clamps);
  the two heads' probabilities and w are its ``details``, their own parts its ``inner`` parts;
* a head with a pool factor: ``head`` (its log-probability as the shots left it; the linear head's ``logits / T``)
  + ``pool`` (``a·(x̂W_Gᵀ + b_G)``), the head's own parts ``inner``.

Rows are explained ``batch`` at a time: the kernel between a batch and the support vectors is computed once and
gives both the scores and the contributions, so memory is bounded by one batch whatever the number of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch
import torch.nn.functional as F

from svgen.calibration import temperatures as calibration
from svgen.core import logits as logit_kinds
from svgen.core.support import IMAGE, POOL, TEXT
from svgen.errors import SvgenError
from svgen.evaluation.explanation import ClassExplanation, Contribution, RowExplanation
from svgen.heads import predictor
from svgen.heads.scoring import (CLIP_LOGIT_SCALE, MIXTURE, cosine_logits, kernel_from_gram_, linear_logits, prior_probs,
                                 topk)
from svgen.state import Heads

BATCH = 256              # rows explained at once: bounds the batch × support-vector kernel
SCORE_BLOCK = 8192       # support vectors per block, as kernel_scores sums them
SHOTS_FORM = "zero-shot logits + α·s·LDA logits"   # the linear head with shots (svgen.fewshot.lda)

PARTS = {
    "prior": "zero-shot prior softmax(τ·x̂P̂ᵀ)",
    "votes": "support vectors' votes Σ k(x̂,s)·A[s,c]",
    "cosine": "cosine part 100·x̂p̂ᵀ",
    "shots": "shots' part α·s·LDA logits",
    "weight": "x̂·wᵀ",
    "bias": "bias",
    "mixture": "log(w·p_kernel + (1−w)·p_linear)",
    "tilt": "classes without shots: tilt − log Z",
    "floor": "floor at 1e-30",
    "head": "the head's log-probability before the pool",
    "pool": "pool factor a·(x̂W_Gᵀ + b_G)",
}


@dataclass
class Origins:
    """Where each kernel row came from: its class, its kind, and for a labelled image its file path or row."""

    classes: list
    n_support: int                 # K, the text rows per class
    n_templates: int               # T, the templates per class
    templates: Optional[list] = None
    shots: Optional[list] = None   # one record per image row ({"path"} / {"file", "row"} / {"row"}), None: not kept

    @property
    def recorded(self) -> bool:
        return self.shots is not None

    def text_kind(self, k: int) -> tuple:
        """(kind, where) of text slot ``k`` of a class (:mod:`svgen.core.generator`)."""
        K, T = self.n_support, self.n_templates
        if T >= 2 and k < T:
            members = list(range(k, T, K))
            names = [self.templates[t] for t in members[:2]] if self.templates and len(self.templates) == T else []
            more = ", …" if len(members) > 2 else ""
            return "template group", (f"templates {members}" + (f" ({', '.join(map(repr, names))}{more})"
                                                                  if names else ""))
        return ("text prototype", None) if K == 1 else ("generated", f"slot {k}")

    def shot(self, i: int) -> Optional[str]:
        """The file path or row the ``i``-th labelled image came from (None: not recorded)."""
        if self.shots is None or i >= len(self.shots) or not self.shots[i]:
            return None
        rec = self.shots[i]
        if "path" in rec:
            return str(rec["path"])
        return f"{rec['file']}[{rec['row']}]" if "file" in rec else f"row {rec['row']}"


class Explainer:
    """Explains rows of features under one head of ``heads`` (``kind``: the kernel, e.g. ``"rbf"``)."""

    def __init__(self, heads: Heads, prototypes: torch.Tensor, kind: str, head: str, origins: Origins,
                 linear_form: Optional[str] = None):
        self.heads, self.P, self.kind, self.origins = heads, prototypes.float(), kind, origins
        self.head = predictor.check_head(heads, head)
        self.linear_form = linear_form
        self.power = predictor.pool_power(heads, head)
        self.base = head   # the head under the pool's factor (the head itself without one)
        self.uses_kernel = head in ("kernel", MIXTURE)
        k = heads.kernel
        self.S = F.normalize(k.flat_rows().float(), dim=-1) if self.uses_kernel else None
        self.A = k.votes.coalesce() if k.votes.is_sparse else k.votes.float()
        self._origin_cache: dict = {}
        M = k.flat_rows().shape[0]
        if k.labels is None:
            self.labels = torch.arange(M) // origins.n_support
            self.source = torch.full((M,), TEXT, dtype=torch.uint8)
        else:
            self.labels, self.source = k.labels.long(), k.source
        self.rank = torch.zeros(M, dtype=torch.long)   # the row's place among the rows of its source
        for s in (TEXT, IMAGE, POOL):
            where = self.source == s
            self.rank[where] = torch.arange(int(where.sum()))

    # ------------------------------------------------------------------ provenance
    def origin(self, m: int) -> dict:
        """``{"row", "class", "kind", "from"}`` of kernel row ``m``."""
        hit = self._origin_cache.get(m)
        if hit is not None:
            return hit
        c, s, r = int(self.labels[m]), int(self.source[m]), int(self.rank[m])
        if s == TEXT:
            kind, where = self.origins.text_kind(r % self.origins.n_support)
        elif s == IMAGE:
            kind, where = "labelled shot", self.origins.shot(r) or f"shot #{r} (path not recorded)"
        else:
            kind, where = "pool image", f"pool row #{r}"
        out = {"row": m, "class": str(self.origins.classes[c]), "kind": kind, "from": where}
        self._origin_cache[m] = out
        return out

    # ------------------------------------------------------------------ scores of a batch
    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        """``k(x̂, S)`` (N×M float32), the Gram computed as :func:`svgen.heads.scoring.kernel_scores` does."""
        return kernel_from_gram_(F.normalize(x, dim=-1) @ self.S.T, float(self.heads.kernel.bandwidth), self.kind)

    def _votes(self, Kx: torch.Tensor) -> torch.Tensor:
        """``Kx @ A`` summed over the same blocks of support vectors as :func:`~svgen.heads.scoring.kernel_scores`
        (float32), so the sum is the one ``classify`` prints."""
        if self.A.is_sparse:
            return torch.sparse.mm(self.A.t(), Kx.T).T
        out = torch.zeros(Kx.shape[0], self.A.shape[1], dtype=Kx.dtype)
        for start in range(0, Kx.shape[1], SCORE_BLOCK):
            out.addmm_(Kx[:, start:start + SCORE_BLOCK], self.A[start:start + SCORE_BLOCK])
        return out

    def _columns(self, cols: torch.Tensor) -> torch.Tensor:
        """``A[:, cols]`` dense (M×len(cols), float64)."""
        if self.A.is_sparse:
            return self.A.t().index_select(0, cols).to_dense().T.double()
        return self.A[:, cols].double()

    def batch(self, x: torch.Tensor, top_k: int, n_contrib: int) -> List[RowExplanation]:
        """The explanations of the rows of ``x`` (N×D, checked features)."""
        x = x.float()
        h, cal = self.heads, self.heads.calibration
        Kx = s_kernel = prior = None
        part = {}   # head name → N×C float64 score matrices of its parts
        if self.uses_kernel:
            Kx = self._kernel(x)
            votes = self._votes(Kx).double()
            prior = (prior_probs(x, self.P, h.kernel.prior_scale).double() if h.kernel.prior_scale is not None
                     else None)
            s_kernel = votes if prior is None else votes + prior
            part["kernel"] = {"votes": votes, **({"prior": prior} if prior is not None else {})}
        if self.head in ("linear", MIXTURE):
            part["linear"] = self._linear_parts(x)
        if self.head == "cosine":
            part["cosine"] = {"cosine": cosine_logits(x, self.P).double()}
        if self.head == MIXTURE:
            p_k = calibration.softmax(logit_kinds.head_logits(s_kernel, "kernel", cal.kernel_logits, prior,
                                                              cal.kernel_floor), cal.temperatures["kernel"])
            s_lin = sum(part["linear"].values())
            p_l = calibration.softmax(s_lin, cal.temperatures["linear"])
            p_mix = calibration.mix(cal.mixture_weight, p_k, p_l)
            mixed = {"mixture": p_mix.clamp_min(1e-300).log()}
            p = p_mix
            if cal.shotless_offset:
                p = calibration.tilt(p_mix, cal.shotless_offset, predictor.shotless_classes(h))
                mixed["tilt"] = p.clamp_min(1e-300).log() - mixed["mixture"]
            final = p.clamp_min(logit_kinds.KERNEL_LOG_FLOOR).log()
            floor = final - sum(mixed.values())
            if bool((floor != 0).any()):
                mixed["floor"] = floor
            part[MIXTURE] = mixed
            details = {"weight": cal.mixture_weight, "p_kernel": p_k, "p_linear": p_l}
        else:
            details = {}
        own = part[self.head]
        if self.power is not None:
            base = sum(own.values())
            if self.head == "linear":
                z0 = base / cal.temperatures["linear"]
            elif self.head == "kernel":
                z0 = calibration.softmax(logit_kinds.head_logits(base, "kernel", cal.kernel_logits, prior,
                                                                 cal.kernel_floor),
                                         cal.temperatures["kernel"]).clamp_min(logit_kinds.KERNEL_LOG_FLOOR).log()
            else:
                z0 = base   # the mixture's scores are already log max(p, 1e-30)
            top_parts = {"head": z0, "pool": self.power * predictor.pool_log_likelihood(h, x)}
            inner_heads = {self.head: own}
        else:
            top_parts, inner_heads = own, {}
        if self.head == MIXTURE:
            inner_heads.update({"kernel": part["kernel"], "linear": part["linear"]})
        scores = sum(top_parts.values())
        return self._rows(scores, top_parts, inner_heads, details, Kx, top_k, n_contrib)

    def _linear_parts(self, x: torch.Tensor) -> dict:
        lin = linear_logits(x, self.heads.linear.weight, self.heads.linear.bias).double()
        if self.linear_form == SHOTS_FORM:
            cos = cosine_logits(x, self.P).double()   # W = 100·P̂ + α·s·W_lda (svgen.fewshot.lda)
            return {"cosine": cos, "shots": lin - cos}
        bias = self.heads.linear.bias.double()[None, :].expand_as(lin)
        return {"weight": lin - bias, "bias": bias}

    def _rows(self, scores, top_parts, inner_heads, details, Kx, top_k, n_contrib) -> List[RowExplanation]:
        N, C = scores.shape
        ranked = topk(scores.float(), min(max(top_k, 2), C))[1]
        explained = ranked[:, :top_k]
        cols = None
        if Kx is not None:   # every class explained in this batch: its column of A, once
            uniq, inverse = torch.unique(explained, return_inverse=True)
            cols = (uniq, inverse, self._columns(uniq))
        names = self.origins.classes
        out = []
        for i in range(N):
            classes = []
            for r in range(explained.shape[1]):
                c = int(explained[i, r])
                parts = {k: float(v[i, c]) for k, v in top_parts.items()}
                inner = {hd: {k: float(v[i, c]) for k, v in ps.items()} for hd, ps in inner_heads.items()}
                det = {k: (float(v[i, c]) if isinstance(v, torch.Tensor) else float(v)) for k, v in details.items()}
                pro, con, total = ([], [], None)
                if cols is not None:
                    contrib = Kx[i].double() * cols[2][:, int(cols[1][i, r])]
                    pro, con = self._contributions(contrib, n_contrib, Kx[i], cols[2][:, int(cols[1][i, r])])
                    total = contrib
                classes.append(ClassExplanation(c, str(names[c]), float(scores[i, c]), parts, inner, det, pro, con))
                if r == 0 and total is not None:
                    top_contrib = total
            runner = int(ranked[i, 1]) if ranked.shape[1] > 1 else None
            margin = None if runner is None else float(scores[i, int(ranked[i, 0])] - scores[i, runner])
            flip = None
            if runner is not None and self.head == "kernel" and self.power is None:
                flip = _votes_to_flip(top_contrib, margin)
            out.append(RowExplanation(self.head, classes, None if runner is None else str(names[runner]),
                                      runner, margin, flip))
        return out

    def _contributions(self, contrib, n: int, k_row, a_col) -> tuple:
        """The ``n`` largest positive and the ``n`` most negative votes of one class at one input."""
        n = min(n, contrib.shape[0])
        res = []
        for sign in (1.0, -1.0):
            v, idx = torch.topk(sign * contrib, n)
            res.append([Contribution(float(sign * val), float(k_row[m]), float(a_col[m]), self.origin(int(m)))
                        for val, m in zip(v.tolist(), idx.tolist()) if val > 0])
        return res[0], res[1]

    def explain(self, X: torch.Tensor, top_k: int = 3, top_contributions: int = 5,
                batch: int = BATCH) -> Iterator[RowExplanation]:
        """Explanations of every row of ``X``, one batch at a time (a generator: the caller decides what to keep)."""
        if top_k < 1 or top_contributions < 0:
            raise SvgenError(f"top_k must be at least 1 and top_contributions at least 0, got {top_k} and "
                             f"{top_contributions}", cli=f"--top-k must be at least 1 and --contributions at least "
                                                         f"0, got {top_k} and {top_contributions}")
        with torch.no_grad():
            for s in range(0, X.shape[0], batch):
                yield from self.batch(torch.as_tensor(X[s:s + batch]), top_k, top_contributions)


def _votes_to_flip(contrib: torch.Tensor, margin: float) -> Optional[int]:
    """The fewest of the top class's largest votes whose removal (their votes for it zeroed) drops it below the
    runner-up: their sum exceeds the margin. None when even all its positive votes do not."""
    pos = torch.sort(contrib[contrib > 0], descending=True).values
    over = (torch.cumsum(pos, 0) > margin).nonzero()
    return int(over[0]) + 1 if over.numel() else None


__all__ = ["Explainer", "Origins", "PARTS", "BATCH", "CLIP_LOGIT_SCALE"]
