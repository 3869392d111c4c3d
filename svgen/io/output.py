"""Prediction files: one schema for every engine and format, written block by block.

A prediction row is the input's key columns, then the top-k class names and their values:

* key columns: ``path`` for images; ``index`` (running row number over all inputs), ``source``
  (the features file) and ``row`` (the row in that file) for precomputed embeddings;
* ``labels``: the top-k class names, best first;
* ``scores`` (a head's scores or logits) or ``probs`` (with ``--probs``): their values;
* ``head``: the head that produced them.

``svgen classify --engine ray`` writes exactly these columns (:func:`svgen.engine.predictions.prediction_table`);
locally the formats are

* ``parquet``: the same table (list columns; float32 values held exactly as float64);
* ``jsonl``: one strict-JSON object per line with the same keys;
* ``csv``: the key columns, then ``label_1, score_1 (or prob_1), …, label_k, …``, then ``head``.

Values are float32 in every path and format (scores and probabilities alike; probabilities computed in
float64 are rounded to float32 once, here) and printed in full: the shortest decimal that reads back as
the same float32 (``1382.0834``, not ``1382.08``). Non-finite scores are written as ``null`` in JSON Lines and
Parquet and as an empty cell in CSV, with one warning; non-finite probabilities are refused
(a probability is never NaN). Rows are written as blocks arrive, so memory stays at one block
of scores whatever the number of inputs (issue 24, item 10).
"""

from __future__ import annotations

import csv
import json
import logging
from pathlib import Path
from typing import Dict, Iterable, Iterator, Optional, Sequence, TextIO, Tuple

import numpy as np

from svgen.errors import SvgenError

log = logging.getLogger(__name__)

FORMATS = ("csv", "jsonl", "parquet")
SUFFIXES = {".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet"}
_NAMES = ".csv, .jsonl (.ndjson) or .parquet"
IMAGE_KEYS = ("path",)
FEATURE_KEYS = ("index", "source", "row")

Block = Tuple[Dict[str, list], "object"]  # (key columns, N×C scores tensor or array)
BLOCK_ROWS = 4096  # rows scored and written per step: what is in memory at a time, whatever N is


def output_format(out: Optional[str], fmt: Optional[str], default: str = "csv") -> str:
    """The format to write: ``--format`` if given, else the suffix of ``--out``, else (stdout) ``default``.

    ``out`` must end in a known suffix (:data:`SUFFIXES`), so predictions never land in ``mycode.py``;
    a known suffix that contradicts ``--format`` (``--format csv --out p.jsonl``) is refused.
    """
    by_suffix = SUFFIXES.get(Path(out).suffix.lower()) if out else None
    if out and by_suffix is None:
        said = f"unknown suffix {Path(out).suffix!r}" if Path(out).suffix else "no suffix"
        raise SvgenError(f"out {out}: {said}; predictions are written to {_NAMES} files",
                         cli=f"--out {out}: {said}; classify writes {_NAMES} files")
    if fmt and by_suffix and fmt != by_suffix:
        what = f"{out} (a .{Path(out).suffix.lower()[1:]} file is {by_suffix})"
        raise SvgenError(f"format {fmt!r} contradicts out {what}; drop format or rename the file",
                         cli=f"--format {fmt} contradicts --out {what}; drop --format or rename the file")
    return fmt or by_suffix or default


def check_ray_folder(out: str) -> None:
    """The Ray engine's ``out`` is a folder of Parquet parts: named ``FOLDER`` or ``FOLDER.parquet``;
    any other suffix (``x.csv``, ``x.jsonl``) promises a file it would not write, and is refused."""
    suffix = Path(out).suffix
    if suffix and suffix.lower() != ".parquet":
        why = f"{out}: the Ray engine writes a folder of Parquet parts, not a {suffix} file"
        raise SvgenError(f"out {why}; name it FOLDER or FOLDER.parquet",
                         cli=f"--out {why}; name it FOLDER or FOLDER.parquet")


def value_column(probs: bool) -> str:
    return "probs" if probs else "scores"


def value_text(values: np.ndarray) -> list:
    """The shortest decimal of each value that reads back as the same float32; None where not finite."""
    v = np.asarray(values).astype(np.float32).ravel()
    return [str(x) if np.isfinite(x) else None for x in v]


class _NonFinite:
    """Counts the non-finite values written; probabilities must be finite."""

    def __init__(self, probs: bool, head: str):
        self.probs, self.head, self.count = probs, head, 0

    def check(self, values: np.ndarray, keys: Dict[str, list]) -> None:
        bad = ~np.isfinite(values)
        if bad.any():
            if self.probs:
                row = int(bad.any(axis=1).nonzero()[0][0])
                first = next(iter(keys.values()))[row]
                raise SvgenError(f"the {self.head} head gives non-finite probabilities (first for input {first}); "
                                 "its scores overflow: the artifact's weights are not usable")
            self.count += int(bad.sum())

    def report(self) -> None:
        if self.count:
            log.warning("%d top-k score(s) of the %s head were not finite (NaN or ±inf); they are written as "
                        "null (an empty cell in CSV)", self.count, self.head)


def _top(scores, k: int) -> Tuple[np.ndarray, np.ndarray]:
    import torch

    from svgen.heads.scoring import topk

    s = torch.as_tensor(scores)
    if s.shape[0] == 0:
        return np.zeros((0, min(k, s.shape[1])), np.float32), np.zeros((0, min(k, s.shape[1])), np.int64)
    # NaN sorts as the largest in torch.topk; rank it last instead, so a damaged score never tops a row
    nan = torch.isnan(s)
    s = torch.where(nan, torch.full_like(s, -float("inf")), s) if nan.any() else s
    values, indices = topk(s, k)
    if nan.any():  # written as null, as the NaN it was
        values = torch.where(nan.gather(1, indices), torch.full_like(values, float("nan")), values)
    return values.float().numpy(), indices.numpy()   # one precision in every path: float32


def _header_csv(key_names: Sequence[str], k: int, probs: bool) -> list:
    what = "prob" if probs else "score"
    return list(key_names) + [f"{x}_{r}" for r in range(1, k + 1) for x in ("label", what)] + ["head"]


def write_text_rows(stream: TextIO, blocks: Iterable[Block], classes: Sequence[str], k: int, fmt: str, head: str,
                    probs: bool) -> int:
    """Write ``blocks`` of (keys, scores) as CSV or JSON Lines to ``stream``; returns the rows written.

    The CSV writer keeps Python's default quoting and ``\\r\\n`` line ends, so a field holding a
    newline or carriage return (a file name may) is quoted and reads back as one row.
    """
    guard = _NonFinite(probs, head)
    n = 0
    writer = csv.writer(stream) if fmt == "csv" else None
    header = False
    col = value_column(probs)
    for keys, scores in blocks:
        values, indices = _top(scores, k)
        guard.check(values, keys)
        if writer is not None and not header:
            writer.writerow(_header_csv(list(keys), values.shape[1] if values.size else min(k, len(classes)), probs))
            header = True
        rows = len(values)
        text = value_text(values)
        kk = values.shape[1] if rows else 0
        names = list(keys)
        for i in range(rows):
            labels = [classes[j] for j in indices[i]]
            vals = text[i * kk:(i + 1) * kk]
            if writer is not None:
                row = [keys[c][i] for c in names]
                for label, v in zip(labels, vals):
                    row += [label, "" if v is None else v]
                writer.writerow(row + [head])
            else:
                parts = [f"{json.dumps(c)}: {json.dumps(keys[c][i], ensure_ascii=False)}" for c in names]
                parts.append(f'"labels": {json.dumps(labels, ensure_ascii=False)}')
                parts.append(f'"{col}": [' + ", ".join("null" if v is None else v for v in vals) + "]")
                parts.append(f'"head": {json.dumps(head)}')
                stream.write("{" + ", ".join(parts) + "}\n")
        n += rows
    guard.report()
    return n


def require_pyarrow():
    """``pyarrow`` (with its Parquet module), or one line saying what to install."""
    try:
        import pyarrow
        import pyarrow.parquet  # noqa: F401
    except ImportError:
        raise SvgenError("Parquet output needs pyarrow: pip install 'svgen[ray]' (or pip install pyarrow), "
                         "or write .csv / .jsonl") from None
    return pyarrow


def write_parquet(path, blocks: Iterable[Block], classes: Sequence[str], k: int, head: str, probs: bool) -> int:
    """Write ``blocks`` as one Parquet file (a row group per block) with the Ray engine's columns."""
    pa = require_pyarrow()
    pq = pa.parquet
    guard = _NonFinite(probs, head)
    writer = None
    n = 0
    try:
        for keys, scores in blocks:
            values, indices = _top(scores, k)
            guard.check(values, keys)
            cols = {name: pa.array(v, type=pa.int64() if name in ("index", "row") else pa.string())
                    for name, v in keys.items()}
            cols["labels"] = pa.array([[classes[j] for j in row] for row in indices.tolist()],
                                      type=pa.list_(pa.string()))
            vals = [[float(x) if np.isfinite(x) else None for x in row] for row in values]
            cols[value_column(probs)] = pa.array(vals, type=pa.list_(pa.float64()))
            cols["head"] = pa.array([head] * len(values), type=pa.string())
            table = pa.table(cols)
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table)
            n += len(values)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        raise SvgenError("nothing to write: no rows")
    guard.report()
    return n


def feature_blocks(arrays: Sequence[tuple], score_fn, block_rows: Optional[int] = None) -> Iterator[Block]:
    """(keys, scores) blocks over several N×D feature files, ``block_rows`` (default :data:`BLOCK_ROWS`) rows at a time.

    ``arrays``: ``(file, its (memory-mapped) array)`` pairs, in order (a file listed twice is there twice, its rows
    indexed on); ``score_fn(x)`` the N×C scores of a float32 block.
    """
    block_rows = block_rows or BLOCK_ROWS
    index = 0
    for f, x in arrays:
        for s in range(0, x.shape[0], block_rows):
            e = min(s + block_rows, x.shape[0])
            chunk = np.array(x[s:e], dtype=np.float32)  # a copy: a memory-mapped slice is read-only
            keys = {"index": list(range(index + s, index + e)), "source": [str(f)] * (e - s),
                    "row": list(range(s, e))}
            yield keys, score_fn(chunk)
        index += x.shape[0]


def matrix_blocks(keys: Dict[str, list], scores, block_rows: Optional[int] = None) -> Iterator[Block]:
    """(keys, scores) blocks of rows already held in memory (``--transductive``)."""
    block_rows = block_rows or BLOCK_ROWS
    n = int(scores.shape[0])
    for s in range(0, n, block_rows):
        yield {c: v[s:s + block_rows] for c, v in keys.items()}, scores[s:s + block_rows]
