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

import gc
import math
from dataclasses import dataclass
from typing import Iterator, List, Optional

import torch
import torch.nn.functional as F

from svgen.heads import calibration
from svgen.core import logits as logit_kinds
from svgen.core.support import IMAGE, POOL, TEXT
from svgen.errors import SvgenError
from svgen.evaluation.explanation import ClassExplanation, Contribution, RowExplanation
from svgen.heads import predictor
from svgen.heads.scoring import (CLIP_LOGIT_SCALE, MIXTURE, cosine_logits, kernel_from_gram_, linear_logits, prior_probs,
                                 topk)
from svgen.state import Heads, LinearForm

BATCH = 2048             # rows explained at once (fewer with many support vectors: KERNEL_ELEMENTS)
KERNEL_ELEMENTS = 1 << 24    # k(x̂, s) values of a batch held at once (float32)
SCORE_BLOCK = 8192       # support vectors per block, as kernel_scores sums them
CONTRIB_ELEMENTS = 1 << 23   # votes k(x̂, s)·A[s, c] held at once (float32)

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
                 linear_form: Optional[LinearForm] = None):
        self.heads, self.P, self.kind, self.origins = heads, prototypes.float(), kind, origins
        self.head = predictor.check_head(heads, head)
        self.linear_form = linear_form
        self.power = predictor.pool_power(heads, head)
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
        rank = torch.zeros(M, dtype=torch.long)   # the row's place among the rows of its source
        for s in (TEXT, IMAGE, POOL):
            where = self.source == s
            rank[where] = torch.arange(int(where.sum()))
        self._rows_of = (self.labels.tolist(), self.source.tolist(), rank.tolist())   # plain lists: read per vote

    # ------------------------------------------------------------------ provenance
    def origin(self, m: int) -> dict:
        """``{"row", "class", "kind", "from"}`` of kernel row ``m``."""
        hit = self._origin_cache.get(m)
        if hit is not None:
            return hit
        c, s, r = self._rows_of[0][m], self._rows_of[1][m], self._rows_of[2][m]
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
        """``A[:, cols]`` dense (M×len(cols), float32)."""
        if self.A.is_sparse:
            return self.A.t().index_select(0, cols).to_dense().T.float()
        return self.A[:, cols]

    def batch(self, x: torch.Tensor, top_k: int, n_contrib: int) -> List[RowExplanation]:
        """The explanations of the rows of ``x`` (N×D, checked features)."""
        x = x.float()
        h, cal = self.heads, self.heads.calibration
        Kx = s_kernel = prior = None
        part = {}   # head name → N×C float64 score matrices of its parts
        if self.uses_kernel:
            Kx = self._kernel(x)
            votes = self._votes(Kx)   # float32, as classify sums them
            prior = prior_probs(x, self.P, h.kernel.prior_scale) if h.kernel.prior_scale is not None else None
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
            clamped = p < logit_kinds.KERNEL_LOG_FLOOR   # the score is log max(p, 1e-30)
            if bool(clamped.any()):
                floor = math.log(logit_kinds.KERNEL_LOG_FLOOR) - sum(mixed.values())
                mixed["floor"] = torch.where(clamped, floor, torch.zeros_like(floor))
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
        if self.linear_form is LinearForm.ZERO_SHOT_PLUS_LDA:
            cos = cosine_logits(x, self.P).double()   # W = 100·P̂ + α·s·W_lda (svgen.adapt.lda)
            return {"cosine": cos, "shots": lin - cos}
        bias = self.heads.linear.bias.double()[None, :].expand_as(lin)
        return {"weight": lin - bias, "bias": bias}

    def _rows(self, *args) -> List[RowExplanation]:
        """The batch's explanations; many small objects at once, so without the cyclic garbage collector, which
        would otherwise rescan them all again and again (none of them is in a cycle)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._build(*args)
        finally:
            if collecting:
                gc.enable()

    def _build(self, scores, top_parts, inner_heads, details, Kx, top_k, n_contrib) -> List[RowExplanation]:
        N, C = scores.shape
        ranked = topk(scores.float(), min(max(top_k, 2), C))[1]
        explained = ranked[:, :top_k]
        R = explained.shape[1]
        at = (torch.arange(N)[:, None].expand(N, R), explained)

        def pick(v):   # N×R python floats of an N×C matrix at the explained classes
            return v[at].tolist() if isinstance(v, torch.Tensor) else [[float(v)] * R] * N

        parts = {k: pick(v) for k, v in top_parts.items()}
        inner = {hd: {k: pick(v) for k, v in ps.items()} for hd, ps in inner_heads.items()}
        det = {k: pick(v) for k, v in details.items()}
        score, cls = pick(scores), explained.tolist()
        runner = ranked[:, 1].tolist() if ranked.shape[1] > 1 else [None] * N
        margin = ((scores.gather(1, ranked[:, :1]) - scores.gather(1, ranked[:, 1:2]))[:, 0].tolist()
                  if ranked.shape[1] > 1 else [None] * N)
        lists, flips = [[([], [])] * R] * N, [None] * N
        if Kx is not None:   # the votes of a few rows at a time (rows × top_k × M of them)
            step = max(1, CONTRIB_ELEMENTS // (R * Kx.shape[1]))
            uniq, inverse = torch.unique(explained, return_inverse=True)
            columns = self._columns(uniq).T      # U×M: A[:, c] of each class explained in the batch
            lists, flips = [], []
            for s in range(0, N, step):
                got = self._contributions(Kx[s:s + step], columns, inverse[s:s + step], n_contrib, margin[s:s + step])
                lists += got[0]
                flips += got[1]
        names = self.origins.classes
        out = []
        for i in range(N):
            classes = [ClassExplanation(cls[i][r], str(names[cls[i][r]]), score[i][r],
                                        {k: v[i][r] for k, v in parts.items()},
                                        {hd: {k: v[i][r] for k, v in ps.items()} for hd, ps in inner.items()},
                                        {k: v[i][r] for k, v in det.items()}, *lists[i][r]) for r in range(R)]
            out.append(RowExplanation(self.head, classes, None if runner[i] is None else str(names[runner[i]]),
                                      runner[i], margin[i], flips[i]))
        return out

    def _contributions(self, Kx, columns, inverse, n: int, margin) -> tuple:
        """Per row and explained class, (the ``n`` largest positive votes, the ``n`` most negative ones) as
        :class:`Contribution` lists; per row the votes to flip (:func:`votes_to_flip`, kernel head only).
        ``columns[inverse[i, r]]``: the vote weights of row i's r-th class."""
        N, R = inverse.shape
        contrib = columns[inverse].mul_(Kx[:, None, :])   # N×R×M: k(x̂, s)·A[s, c] of each explained class
        flip = self.head == "kernel" and self.power is None and margin[0] is not None
        n = min(n, contrib.shape[2])
        found, head = [], None
        for largest in (True, False):
            v, idx = torch.topk(contrib, n, dim=2, largest=largest)
            head = v[:, 0, :] if largest else head   # the top class's largest votes: most rows flip within them
            found.append((v.tolist(), idx.tolist(), Kx.gather(1, idx.reshape(N, -1)).reshape(idx.shape).tolist(),
                          columns[inverse[:, :, None].expand_as(idx), idx].tolist()))
        cache, origin = self._origin_cache, self.origin
        lists = [[tuple([Contribution(val, k, a, cache.get(m) or origin(m))
                         for val, m, k, a in zip(v[i][r], ix[i][r], kk[i][r], aa[i][r]) if sign * val > 0]
                        for sign, (v, ix, kk, aa) in zip((1.0, -1.0), found)) for r in range(R)] for i in range(N)]
        flips = votes_to_flip(contrib[:, 0, :], torch.tensor(margin, dtype=torch.float64), head) if flip else [None] * N
        return lists, flips

    def explain(self, X: torch.Tensor, top_k: int = 3, top_contributions: int = 5,
                batch: int = BATCH) -> Iterator[RowExplanation]:
        """Explanations of every row of ``X``, one batch at a time (a generator: the caller decides what to keep)."""
        if top_k < 1 or top_contributions < 0:
            raise SvgenError(f"top_k must be at least 1 and top_contributions at least 0, got {top_k} and "
                             f"{top_contributions}", cli=f"--top-k must be at least 1 and --contributions at least "
                                                         f"0, got {top_k} and {top_contributions}")
        if self.uses_kernel:   # the batch's kernel (batch × M, float32) stays under about 64 MB
            batch = min(batch, max(64, KERNEL_ELEMENTS // max(1, int(self.source.shape[0]))))
        with torch.no_grad():
            for s in range(0, X.shape[0], batch):
                yield from self.batch(torch.as_tensor(X[s:s + batch]), top_k, top_contributions)


def votes_to_flip(contrib: torch.Tensor, margin: torch.Tensor, largest: Optional[torch.Tensor] = None) -> list:
    """Per row, the fewest of the top class's largest votes (``contrib``: N×M, its votes at each row) whose removal
    (those votes for it zeroed) drops it below the runner-up: their sum exceeds the ``margin``. None where even all
    its positive votes do not. ``largest``: each row's few largest votes, already found (tried first); only the rows
    they do not flip are sorted whole."""
    def count(pos, m):
        over = torch.cumsum(pos.clamp_min(0).double(), dim=1) > m[:, None]
        return (over.to(torch.uint8).argmax(dim=1) + 1).tolist(), over.any(dim=1)

    out = [None] * contrib.shape[0]
    rest = torch.arange(contrib.shape[0])
    if largest is not None and largest.shape[1]:
        n, ok = count(largest, margin)
        out = [v if o else None for v, o in zip(n, ok.tolist())]
        rest = (~ok).nonzero()[:, 0]
    if rest.numel() and (largest is None or largest.shape[1] < contrib.shape[1]):
        n, ok = count(torch.sort(contrib[rest], dim=1, descending=True).values, margin[rest])
        for i, v, o in zip(rest.tolist(), n, ok.tolist()):
            out[i] = v if o else None
    return out


__all__ = ["Explainer", "Origins", "PARTS", "BATCH", "CLIP_LOGIT_SCALE"]
