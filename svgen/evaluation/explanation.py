"""The typed result of an explanation (:mod:`svgen.evaluation.explain`): per input its explained classes, each with
its score, the exact parts that add up to it and the support vectors that voted for and against it; as JSON, as
records, as a pandas DataFrame (``to_frame``, pandas optional) and as a readable table."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, List, NamedTuple, Optional, Sequence

import numpy as np

from svgen.errors import SvgenError


class Contribution(NamedTuple):
    """One support vector's vote for a class at one input: ``value = kernel · vote`` (``k(x̂, s)·A[s, c]``), and
    ``origin``: ``{"row", "class", "kind", "from"}`` (the kernel row, the class and kind it came from, and the
    template group, slot, file path or row). An immutable record: an explanation holds tens of them per input."""

    value: float
    kernel: float
    vote: float
    origin: dict

    def to_json(self) -> dict:
        return {"value": self.value, "kernel": self.kernel, "vote": self.vote, **self.origin}


@dataclass
class ClassExplanation:
    """One explained class of one input: ``score`` (what ``classify`` prints) = the sum of ``parts``; ``inner``: the
    parts of the heads inside it (a mixture's kernel and linear heads, a pooled head's own), ``details``: numbers
    that are not parts (a mixture's weight and its heads' probabilities); ``support_for`` / ``support_against``: the
    support vectors that add most to / take most from the kernel vote inside it."""

    index: int
    name: str
    score: float
    parts: dict
    inner: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)
    support_for: List[Contribution] = field(default_factory=list)
    support_against: List[Contribution] = field(default_factory=list)

    def to_json(self) -> dict:
        out = {"class": self.name, "index": self.index, "score": self.score, "parts": self.parts}
        if self.inner:
            out["inner"] = self.inner
        if self.details:
            out["details"] = self.details
        if self.support_for or self.support_against:
            out["for"] = [c.to_json() for c in self.support_for]
            out["against"] = [c.to_json() for c in self.support_against]
        return out


@dataclass
class RowExplanation:
    """One input: the head, its explained classes best first, the runner-up class and the margin (top-1's score
    minus the runner-up's: the smallest change of score that flips the decision); for a kernel head, the fewest of
    the winner's largest votes whose removal flips it (``votes_to_flip``, None: not even all of them)."""

    head: str
    classes: List[ClassExplanation]
    runner_up: Optional[str]
    runner_up_index: Optional[int]
    margin: Optional[float]
    votes_to_flip: Optional[int] = None
    key: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {**self.key, "head": self.head, "classes": [c.to_json() for c in self.classes],
                "runner_up": self.runner_up, "margin": self.margin, "votes_to_flip": self.votes_to_flip}


class Votes(NamedTuple):
    """A batch's listed votes as arrays (2×N×R×n, [0] for each class, largest first, [1] against it, most negative
    first): ``value = kernel · vote``, ``row`` the kernel row; ``count`` (2×N×R): how many of the n are listed (the
    positive ones for, the negative ones against)."""

    value: np.ndarray
    kernel: np.ndarray
    vote: np.ndarray
    row: np.ndarray
    count: np.ndarray


# JSON lines are assembled from byte fields of fixed width per column (numpy uint8 arrays, ``...×width``), shorter
# texts padded with NUL bytes, which no JSON text holds (json.dumps escapes them): once the fields of a batch are
# concatenated, dropping every NUL byte leaves the text. Every number is formatted in bulk, never one by one.

def _bytes(texts) -> np.ndarray:
    """``...×width`` uint8 fields of a byte-string array (or of a list of bytes), NUL-padded."""
    a = np.ascontiguousarray(np.asarray(texts, dtype="S"))
    a = a if a.dtype.itemsize else a.astype("S1")
    return a.view(np.uint8).reshape(a.shape + (a.dtype.itemsize,))


def _texts(a: np.ndarray) -> np.ndarray:
    """JSON number fields of a float64 array: Python's ``repr``; NaN and ±inf as ``null`` (strict JSON)."""
    a = np.asarray(a, np.float64)
    bad = ~np.isfinite(a)
    text = a.astype("S")
    return _bytes(np.where(bad, b"null", text) if bad.any() else text)


def _float32_texts(a: np.ndarray) -> np.ndarray:
    """JSON number fields of a float32 array, made from its digits: ``d.dddddddde±dd``, nine significant digits
    (what reads back to the same float32) without trailing zeros (``5e-01``); NaN and ±inf as ``null``. Several times
    faster than formatting each number."""
    shape = a.shape
    a = np.asarray(a, np.float64).reshape(-1)
    mag = np.abs(a)
    ok = np.isfinite(mag) & (mag > 0)
    mag = np.where(ok, mag, 1.0)
    e = np.floor(np.log10(mag)).astype(np.int64)
    m = np.rint(mag * 10.0 ** (8 - e))
    over = m >= 1e9   # rounded up to ten digits
    m = np.where(ok, np.where(over, np.rint(m / 10), m), 0).astype(np.int32)
    e = np.where(ok, e + over, 0)
    out = np.zeros((a.size, 15), np.uint8)   # sign, digit, point, 8 digits, e, sign, 2 digits
    d = out[:, 3:11]
    for k in range(7, -1, -1):
        d[:, k] = m % 10
        m //= 10
    zero = np.logical_and.accumulate(d[:, ::-1] == 0, axis=1)[:, ::-1]   # the fraction's trailing zeros
    d += ord("0")
    d[zero] = 0
    out[:, 0] = np.where(a < 0, ord("-"), 0)
    out[:, 1] = m + ord("0")
    out[:, 2] = np.where(zero[:, 0], 0, ord("."))
    out[:, 11], out[:, 12] = ord("e"), np.where(e < 0, ord("-"), ord("+"))
    out[:, 13], out[:, 14] = np.abs(e) // 10 + ord("0"), np.abs(e) % 10 + ord("0")
    bad = ~np.isfinite(a)
    if bad.any():
        out[bad] = 0
        out[bad, :4] = np.frombuffer(b"null", np.uint8)
    return out.reshape(shape + (15,))


def _join(shape: tuple, *fields) -> np.ndarray:
    """``shape × width`` uint8: the fields (byte fields of that shape, or bytes for every element) side by side."""
    parts = [np.broadcast_to(np.frombuffer(f, np.uint8) if isinstance(f, bytes) else f, shape + (len(f),)
                             if isinstance(f, bytes) else shape + (f.shape[-1],)) for f in fields if len(f)]
    return np.concatenate(parts, axis=-1)


@dataclass
class BatchExplanation:
    """A batch of rows explained, as arrays (what :meth:`rows` turns into :class:`RowExplanation` objects and
    :meth:`json_lines` writes without them): the explained classes (N×R, best first), their scores and parts
    (N×R float64 each), the runner-up and margin per row, the votes to flip, and the listed votes (:class:`Votes`,
    None: no kernel inside the head). ``names``: class names and support vectors' origins, as text and JSON."""

    head: str
    classes: np.ndarray
    score: np.ndarray
    parts: dict
    inner: dict
    details: dict
    runner_up: Optional[np.ndarray]
    margin: Optional[np.ndarray]
    votes_to_flip: Optional[list]
    support: Optional[Votes]
    names: Any

    def __len__(self) -> int:
        return self.classes.shape[0]

    def rows(self) -> List[RowExplanation]:
        """One :class:`RowExplanation` per row; many small objects at once, so without the cyclic garbage collector,
        which would otherwise rescan them all again and again (none of them is in a cycle)."""
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._rows()
        finally:
            if collecting:
                gc.enable()

    def _rows(self) -> List[RowExplanation]:
        N, R = self.classes.shape
        name = self.names.name
        cls, score = self.classes.tolist(), self.score.tolist()
        parts = {k: v.tolist() for k, v in self.parts.items()}
        inner = {hd: {k: v.tolist() for k, v in ps.items()} for hd, ps in self.inner.items()}
        det = {k: v.tolist() for k, v in self.details.items()}
        runner = [None] * N if self.runner_up is None else self.runner_up.tolist()
        margin = [None] * N if self.margin is None else self.margin.tolist()
        flips = self.votes_to_flip or [None] * N
        empty = ([], [])
        if self.support is not None:
            sv = self.support
            origin = {m: self.names.origin(m) for m in np.unique(sv.row).tolist()}.__getitem__   # each row once
            V, K, A, M, count = (sv.value.tolist(), sv.kernel.tolist(), sv.vote.tolist(), sv.row.tolist(),
                                 sv.count.tolist())
        out = []
        for i in range(N):
            classes = []
            for r in range(R):
                if self.support is None:
                    lists = empty
                else:
                    lists = [[Contribution(V[j][i][r][t], K[j][i][r][t], A[j][i][r][t], origin(M[j][i][r][t]))
                              for t in range(count[j][i][r])] for j in (0, 1)]
                classes.append(ClassExplanation(cls[i][r], name(cls[i][r]), score[i][r],
                                                {k: v[i][r] for k, v in parts.items()},
                                                {hd: {k: v[i][r] for k, v in ps.items()} for hd, ps in inner.items()},
                                                {k: v[i][r] for k, v in det.items()}, *lists))
            out.append(RowExplanation(self.head, classes, None if runner[i] is None else name(runner[i]), runner[i],
                                      margin[i], flips[i]))
        return out

    def json_lines(self, keys: Sequence[str]) -> str:
        """The rows as JSON, one object per line (each line ending in a newline): the objects of
        :meth:`RowExplanation.to_json`, written without building them, from whole arrays at a time (the float64 scores
        and parts as Python's ``repr``, the float32 votes by :func:`_float32_texts`; non-finite as ``null``).
        ``keys``: per row, the JSON members its object starts with (``'"row": 3'``, or ``""``), as ``json.dumps``
        writes them (ASCII)."""
        N, R = self.classes.shape
        if N == 0:
            return ""
        names, cls, NR = self.names, self.classes, self.classes.shape

        def lookup(values: np.ndarray, text) -> np.ndarray:   # byte fields of text(v) for each of the values
            uniq, inverse = np.unique(values, return_inverse=True)
            return _bytes([text(v).encode() for v in uniq.tolist()])[inverse.reshape(values.shape)]

        def members(table: dict) -> list:   # '"name": number, …' of a table of N×R arrays
            return [x for i, (k, v) in enumerate(table.items())
                    for x in (((", " if i else "") + f'"{k}": ').encode(), _texts(v))]

        item = [b'{"class": ', lookup(cls, names.class_json), b', "index": ', _bytes(cls.astype("S")),
                b', "score": ', _texts(self.score), b', "parts": {', *members(self.parts), b"}"]
        if self.inner:
            item += [b', "inner": {', *[x for i, (hd, ps) in enumerate(self.inner.items())
                                        for x in (((", " if i else "") + f'"{hd}": {{').encode(), *members(ps), b"}")],
                     b"}"]
        if self.details:
            item += [b', "details": {', *members(self.details), b"}"]
        sv = self.support
        if sv is not None and sv.value.shape[-1]:
            shape = sv.row.shape   # 2×N×R×n
            one = _join(shape, np.where(np.arange(shape[-1])[:, None] > 0, np.frombuffer(b", ", np.uint8), 0),
                        b'{"value": ', _float32_texts(sv.value), b', "kernel": ', _float32_texts(sv.kernel),
                        b', "vote": ', _float32_texts(sv.vote), b", ", lookup(sv.row, names.origin_json), b"}")
            one[np.arange(shape[-1]) >= sv.count[..., None]] = 0   # only the positive votes for, negative against
            listed = _join(NR, b', "for": [', one[0].reshape(NR + (-1,)), b'], "against": [',
                           one[1].reshape(NR + (-1,)), b"]")
            listed[~(sv.count > 0).any(0)] = 0   # neither: no lists
            item.append(listed)
        item = _join(NR, np.where(np.arange(R)[:, None] > 0, np.frombuffer(b", ", np.uint8), 0), *item, b"}")
        runner = (_bytes([b"null"] * N) if self.runner_up is None else lookup(self.runner_up, names.class_json))
        line = _join((N,), b"{", _bytes([(k + ", ").encode() if k else b"" for k in keys]),
                     f'"head": "{self.head}", "classes": ['.encode(), item.reshape(N, -1), b'], "runner_up": ', runner,
                     b', "margin": ', _bytes([b"null"] * N) if self.margin is None else _texts(self.margin),
                     b', "votes_to_flip": ', _bytes([b"null" if f is None else str(f).encode()
                                                      for f in (self.votes_to_flip or [None] * N)]), b"}\n")
        line = line.reshape(-1)
        return line[line != 0].tobytes().decode("ascii")


@dataclass
class Explanation:
    """Every input's :class:`RowExplanation` (``rows``), the head, and whether the support vectors' file paths or
    rows were recorded in the artifact (``provenance``: ``"recorded"``, or a sentence saying what is missing)."""

    rows: List[RowExplanation]
    head: str
    provenance: str = "recorded"

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i) -> RowExplanation:
        return self.rows[i]

    def __iter__(self):
        return iter(self.rows)

    def to_json(self) -> list:
        return [r.to_json() for r in self.rows]

    def to_records(self) -> list:
        """One flat dict per (input, class, part) and per (input, class, contribution): the rows of
        :meth:`to_frame`."""
        out = []
        for i, row in enumerate(self.rows):
            for rank, c in enumerate(row.classes, 1):
                base = {"input": i, "rank": rank, "class": c.name, "score": c.score, "head": row.head}
                for name, v in c.parts.items():
                    out.append({**base, "what": "part", "name": name, "value": v})
                for head, parts in c.inner.items():
                    out += [{**base, "what": f"{head} part", "name": n, "value": v} for n, v in parts.items()]
                for what, items in (("for", c.support_for), ("against", c.support_against)):
                    out += [{**base, "what": what, "name": f"support row {s.origin['row']}", "value": s.value,
                             "kernel": s.kernel, "vote": s.vote, "origin_class": s.origin["class"],
                             "origin_kind": s.origin["kind"], "origin": s.origin["from"]} for s in items]
        return out

    def to_frame(self):
        """A pandas DataFrame of :meth:`to_records` (pandas is optional: one error line without it)."""
        try:
            import pandas as pd
        except ImportError:
            raise SvgenError("Explanation.to_frame() needs pandas (pip install pandas); to_records() gives the same "
                             "rows as dicts") from None
        return pd.DataFrame.from_records(self.to_records())


def table(row: RowExplanation, parts_text: dict, title: str) -> str:
    """A readable block for one input (``svgen explain``'s stdout)."""
    lines = [title]
    for rank, c in enumerate(row.classes, 1):
        lines.append(f"  {rank}. {c.name}  score {c.score:.6g} = "
                     + " + ".join(f"{v:.6g} ({parts_text.get(k, k)})" for k, v in c.parts.items()))
        for head, parts in c.inner.items():
            lines.append(f"       {head} head: " + " + ".join(f"{v:.6g} ({parts_text.get(k, k)})"
                                                            for k, v in parts.items()))
        if c.details:
            lines.append("       " + ", ".join(f"{k} {v:.4g}" for k, v in c.details.items()))
        for what, items in (("for", c.support_for), ("against", c.support_against)):
            for s in items:
                o = s.origin
                lines.append(f"       {what:>7} {s.value:+.4g} = k {s.kernel:.3g} × vote {s.vote:+.3g}  row {o['row']}: "
                             f"{o['class']}, {o['kind']}" + (f", {o['from']}" if o["from"] else ""))
    if row.runner_up is not None:
        flip = ("" if row.votes_to_flip is None else
                f"; zeroing the {row.votes_to_flip} largest vote(s) for {row.classes[0].name} would flip it")
        lines.append(f"  would have been {row.runner_up} had its score been {row.margin:.4g} higher{flip}")
    return "\n".join(lines) + "\n"
