"""The typed result of an explanation (:mod:`svgen.evaluation.explain`): per input its explained classes, each with
its score, the exact parts that add up to it and the support vectors that voted for and against it; as JSON, as
records, as a pandas DataFrame (``to_frame``, pandas optional) and as a readable table."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, NamedTuple, Optional

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
