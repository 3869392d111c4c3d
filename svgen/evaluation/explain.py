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

Rows are explained ``batch`` at a time: the kernel between a batch and the support vectors is computed once, by the
function ``classify`` scores with (:func:`~svgen.heads.scoring.kernel_scores`, which keeps it), and gives both the
scores and the contributions, so memory is bounded by one batch whatever the number of rows. A batch's explanation is
arrays (:class:`~svgen.evaluation.explanation.BatchExplanation`): ``explain --json`` writes its lines from them, the
table and the Python API turn them into objects.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Iterator, Optional

import numpy as np
import torch

from svgen.heads import calibration
from svgen.core import logits as logit_kinds
from svgen.core.support import IMAGE, POOL, TEXT
from svgen.errors import SvgenError
from svgen.evaluation.explanation import BatchExplanation, RowExplanation, Votes
from svgen.heads import predictor
from svgen.heads.scoring import (CLIP_LOGIT_SCALE, MIXTURE, cosine_logits, kernel_scores, linear_logits, prior_probs,
                                 topk)
from svgen.state import Heads, LinearForm

BATCH = 2048             # rows explained at once (fewer with many support vectors: KERNEL_ELEMENTS)
KERNEL_ELEMENTS = 1 << 24    # k(x̂, s) values of a batch held at once (float32)
CONTRIB_ELEMENTS = 1 << 21   # votes k(x̂, s)·A[s, c] held at once (float32; 8 MB: as fast as 32 MB, and less peak memory)
VOTE_BLOCK = 64          # votes per block in top_votes

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


class Names:
    """What a batch's rows name, as text and as JSON, cached: the classes, and each kernel row's origin."""

    def __init__(self, classes: list, origin):
        self.classes, self.origin = classes, origin
        self._class_json: dict = {}
        self._origin_json: dict = {}

    def name(self, c: int) -> str:
        return str(self.classes[c])

    def class_json(self, c: int) -> str:
        hit = self._class_json.get(c)
        if hit is None:
            hit = self._class_json[c] = json.dumps(self.name(c))
        return hit

    def origin_json(self, m: int) -> str:
        """Kernel row ``m``'s origin as JSON members: ``"row": 5, "class": "…", "kind": "…", "from": …``."""
        hit = self._origin_json.get(m)
        if hit is None:
            hit = self._origin_json[m] = json.dumps(self.origin(m))[1:-1]
        return hit


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
        self.A = k.votes.coalesce() if k.votes.is_sparse else k.votes.float()
        self._origin_cache: dict = {}
        self._AT = None   # Aᵀ (dense votes), made when first needed
        self.names = Names(origins.classes, self.origin)
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
    def _kernel(self, x: torch.Tensor) -> tuple:
        """(``k(x̂, S)`` N×M float32, the votes ``k(x̂, S) @ A`` N×C): one pass of
        :func:`svgen.heads.scoring.kernel_scores`, the function ``classify`` scores with, that also keeps the kernel."""
        k = self.heads.kernel
        Kx = torch.empty(x.shape[0], self.source.shape[0], dtype=torch.float32)
        return Kx, kernel_scores(x, k.rows, k.bandwidth, k.votes, self.kind, kernel_out=Kx)

    def batch(self, x: torch.Tensor, top_k: int, n_contrib: int) -> BatchExplanation:
        """The explanations of the rows of ``x`` (N×D, checked features), as arrays."""
        x = x.float()
        h, cal = self.heads, self.heads.calibration
        Kx = s_kernel = prior = None
        part = {}   # head name → N×C float64 score matrices of its parts
        if self.uses_kernel:
            Kx, votes = self._kernel(x)   # float32, the sum classify prints
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
        return self._arrays(scores, top_parts, inner_heads, details, Kx, top_k, n_contrib)

    def _linear_parts(self, x: torch.Tensor) -> dict:
        lin = linear_logits(x, self.heads.linear.weight, self.heads.linear.bias).double()
        if self.linear_form is LinearForm.ZERO_SHOT_PLUS_LDA:
            cos = cosine_logits(x, self.P).double()   # W = 100·P̂ + α·s·W_lda (svgen.adapt.lda)
            return {"cosine": cos, "shots": lin - cos}
        bias = self.heads.linear.bias.double()[None, :].expand_as(lin)
        return {"weight": lin - bias, "bias": bias}

    def _arrays(self, scores, top_parts, inner_heads, details, Kx, top_k, n_contrib) -> BatchExplanation:
        N, C = scores.shape
        ranked = topk(scores.float(), min(max(top_k, 2), C))[1]
        explained = ranked[:, :top_k]
        R = explained.shape[1]

        def pick(v):   # N×R float64 of an N×C matrix at the explained classes (a number: the same everywhere)
            return v.gather(1, explained).double().numpy() if isinstance(v, torch.Tensor) else np.full((N, R), float(v))

        margin = runner = flips = support = None
        if ranked.shape[1] > 1:
            runner = ranked[:, 1].numpy()
            margin = scores.gather(1, ranked[:, :1]) - scores.gather(1, ranked[:, 1:2])
        if Kx is not None:
            flip = self.head == "kernel" and self.power is None and margin is not None
            support, flips = self._contributions(Kx, explained, n_contrib, margin[:, 0] if flip else None)
        return BatchExplanation(
            self.head, explained.numpy(), pick(scores), {k: pick(v) for k, v in top_parts.items()},
            {hd: {k: pick(v) for k, v in ps.items()} for hd, ps in inner_heads.items()},
            {k: pick(v) for k, v in details.items()}, runner,
            None if margin is None else margin[:, 0].double().numpy(), flips, support, self.names)

    def _columns(self, classes: torch.Tensor) -> tuple:
        """(a U×M dense float32 matrix whose rows are vote columns ``A[:, c]``, the row of each of ``classes``)."""
        if not self.A.is_sparse:
            if self._AT is None:   # Aᵀ once (C×M): a class's votes are then one contiguous row
                self._AT = self.A.T.contiguous()
            return self._AT, classes
        uniq, inverse = torch.unique(classes, return_inverse=True)
        return self.A.t().index_select(0, uniq).to_dense().float(), inverse

    def _contributions(self, Kx, explained, n: int, margin) -> tuple:
        """(:class:`Votes`: per row and explained class the ``n`` largest positive votes ``k(x̂, s)·A[s, c]`` and the
        ``n`` most negative ones; per row the votes to flip (:func:`votes_to_flip`) where ``margin`` is given, else
        None), a few rows at a time (rows × classes × M votes at once at most ``CONTRIB_ELEMENTS``)."""
        N, R = explained.shape
        M = Kx.shape[1]
        n = min(n, M)
        value = torch.empty(2, N, R, n)   # [0]: for (largest first), [1]: against (most negative first)
        row = torch.empty(2, N, R, n, dtype=torch.long)
        vote = torch.empty(2, N, R, n)
        flips = [] if margin is not None else None
        step = max(1, CONTRIB_ELEMENTS // (R * M))
        for s in range(0, N, step):
            e = min(N, s + step)
            columns, at = self._columns(explained[s:e])
            contrib = columns[at].mul_(Kx[s:e, None, :])   # rows × R × M: k(x̂, s)·A[s, c] of each explained class
            for side, largest in enumerate((True, False)):
                v, i = top_votes(contrib, n, largest)
                value[side, s:e], row[side, s:e] = v, i
                vote[side, s:e] = columns[at[:, :, None].expand_as(i), i]
            if flips is not None:   # the top class's largest votes (already found): most rows flip within them
                flips += votes_to_flip(contrib[:, 0, :], margin[s:e].double(), value[0, s:e, 0, :])
            del contrib   # before the next rows' votes are made: one chunk held at a time
        kern = Kx.gather(1, row.permute(1, 0, 2, 3).reshape(N, -1)).reshape(N, 2, R, n).permute(1, 0, 2, 3)
        count = torch.stack([(value[0] > 0).sum(2), (value[1] < 0).sum(2)])   # sorted: the signed ones come first
        return Votes(value.numpy(), kern.numpy(), vote.numpy(), row.numpy(), count.numpy()), flips

    def batches(self, X: torch.Tensor, top_k: int = 3, top_contributions: int = 5,
                batch: int = BATCH) -> Iterator[BatchExplanation]:
        """Every row of ``X`` explained, one :class:`BatchExplanation` (arrays) per batch of rows."""
        if top_k < 1 or top_contributions < 0:
            raise SvgenError(f"top_k must be at least 1 and top_contributions at least 0, got {top_k} and "
                             f"{top_contributions}", cli=f"--top-k must be at least 1 and --contributions at least "
                                                         f"0, got {top_k} and {top_contributions}")
        if self.uses_kernel:   # the batch's kernel (batch × M, float32) stays under about 64 MB
            batch = min(batch, max(64, KERNEL_ELEMENTS // max(1, int(self.source.shape[0]))))
        with torch.no_grad():
            for s in range(0, X.shape[0], batch):
                yield self.batch(torch.as_tensor(X[s:s + batch]), top_k, top_contributions)

    def explain(self, X: torch.Tensor, top_k: int = 3, top_contributions: int = 5,
                batch: int = BATCH) -> Iterator[RowExplanation]:
        """Explanations of every row of ``X``, one batch at a time (a generator: the caller decides what to keep)."""
        for b in self.batches(X, top_k, top_contributions, batch):
            yield from b.rows()


def top_votes(v: torch.Tensor, n: int, largest: bool = True, block: int = VOTE_BLOCK) -> tuple:
    """``torch.topk(v, n, dim=-1, largest=largest)`` (the same values; among equal values maybe other indices), by way
    of the extremes of blocks of ``block`` values: the n largest values lie in the n blocks with the largest maxima
    (any other block's maximum is at most theirs), so after one pass for the blocks' maxima only n·block candidates
    are ranked. Several times faster than ``torch.topk`` on the thousands of votes of each row and class."""
    M = v.shape[-1]
    if n == 0 or M <= 2 * n * block:
        return torch.topk(v, n, dim=-1, largest=largest)
    lead, full = v.shape[:-1], M // block * block
    extreme = (lambda t: t.amax(-1)) if largest else (lambda t: t.amin(-1))
    ext = extreme(v[..., :full].reshape(*lead, M // block, block))
    if full < M:   # the last, shorter block
        ext = torch.cat([ext, extreme(v[..., full:])[..., None]], dim=-1)
    blocks = torch.topk(ext, n, dim=-1, largest=largest).indices
    cand = (blocks[..., None] * block + torch.arange(block)).reshape(*lead, n * block)
    outside = cand >= M   # past the end of the last block
    cand = cand.clamp_(max=M - 1)
    values = v.gather(-1, cand).masked_fill_(outside, -math.inf if largest else math.inf)
    top, at = torch.topk(values, n, dim=-1, largest=largest)
    return top, cand.gather(-1, at)


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
