"""One block's predictions: decoding its images, scoring them, and the rows of its part file.

:func:`score` is the one scoring function of ``svgen classify``: the single-process path and the Ray engine's
actors both call it, and :func:`prediction_table` turns its output into the rows of a part file (key columns,
``labels``, ``scores`` or ``probs``, ``head``). The blocks themselves: :mod:`svgen.engine.blocks`.
"""

from __future__ import annotations

import io
import logging
from typing import Dict, Sequence, Tuple

from svgen.engine.blocks import Block

log = logging.getLogger(__name__)

SCORE_BATCH = 4096  # rows scored at once: bounds the N×C score matrix, not the result


def decode_block(block: Block, preprocess):
    """(N_ok×… float32 images, ok keys, [(key, reason)]) of an image or tar block.

    Every input lands in exactly one of the two lists: ``len(ok) + len(failed) == block.size``.
    """
    import torch

    from svgen.encoders.images import load_image

    images, ok, failed = [], [], []

    def take(key, source):
        x, reason = load_image(source, preprocess)
        if x is None:
            failed.append((key, reason))
        else:
            images.append(x)
            ok.append(key)

    if block.kind == "images":
        for p in block.spec["paths"]:
            take(p, p)
    elif block.kind == "tar":
        shard = block.spec["shard"]
        try:
            f = open(shard, "rb")
        except OSError as e:
            failed.extend((f"{shard}/{m[0]}", f"cannot open shard: {e}") for m in block.spec["members"])
        else:
            with f:
                for name, offset, size, *why in block.spec["members"]:
                    key = f"{shard}/{name}"
                    if offset < 0:   # planned as a failure: a member that is no image file, or the lost tail
                        failed.append((key, why[0] if why else "the shard is truncated or damaged here: its "
                                                               "remaining members cannot be read"))
                        continue
                    f.seek(offset)
                    data = f.read(size)
                    if len(data) != size:
                        failed.append((key, "truncated tar member"))
                    else:
                        take(key, io.BytesIO(data))
    else:
        raise ValueError(f"decode_block: a {block.kind} block holds no images")
    return (torch.stack(images) if images else None), ok, failed


# ----------------------------------------------------------------------------- scoring

_ON_DEVICE: list = []   # the last state copied to a device: [heads, prototypes, device, (heads, prototypes) there]


def score(clf, x, head: str, probs: bool, batch: int = SCORE_BATCH, device=None):
    """N×C scores (``probs``: probabilities) of one head for N×D embeddings, ``batch`` rows at a time (on the CPU).

    ``device``: the encoder's, for embeddings it made (trusted: no input checks); the heads are copied there once and
    each batch is scored there, since with many classes scoring costs as much as encoding. None: user input, through
    the classifier's checks."""
    import torch

    x = torch.as_tensor(x)
    if x.shape[0] == 0:
        return torch.zeros(0, len(clf.class_names_))
    if device is None:
        fn = clf.predict_proba if probs else clf.decision_function
        return torch.cat([fn(x[s:s + batch], head=head) for s in range(0, x.shape[0], batch)])
    from svgen.heads import predictor

    device = torch.device(device)
    heads, P = on_device(clf, device)
    fn = predictor.proba if probs else predictor.scores
    with torch.no_grad():
        return torch.cat([fn(heads, P, clf.fit_config_.kernel, x[s:s + batch].to(device), head, clf.twins_).cpu()
                          for s in range(0, x.shape[0], batch)])


def on_device(clf, device):
    """(heads, prototypes) of ``clf`` on ``device``, copied once per classifier state (the last one is kept)."""
    from svgen.heads import predictor

    # the originals are held, not their ids: a freed state's id can come back as another's
    if not (_ON_DEVICE and _ON_DEVICE[0] is clf.heads_ and _ON_DEVICE[1] is clf.prototypes_
            and _ON_DEVICE[2] == str(device)):
        _ON_DEVICE[:] = [clf.heads_, clf.prototypes_, str(device),
                         (predictor.to_device(clf.heads_, device), clf.prototypes_.to(device))]
        log.debug("scoring %d classes on %s", len(clf.class_names_), device)
    return _ON_DEVICE[3]


def value_column(probs: bool) -> str:
    return "probs" if probs else "scores"


def prediction_table(keys: Dict[str, list], scores, classes: Sequence[str], k: int, head: str, probs: bool):
    """A pyarrow table: the ``keys`` columns, then ``labels`` (top-k names), ``scores``/``probs`` and ``head``."""
    import pyarrow as pa

    from svgen.heads.scoring import topk

    n = int(scores.shape[0])
    if n:
        values, indices = topk(scores, k)
        values, indices = values.float().double().tolist(), indices.tolist()   # float32 values, as locally
    else:
        values, indices = [], []
    cols = {name: pa.array(v, type=pa.int64() if name in ("index", "row") else pa.string())
            for name, v in keys.items()}
    cols["labels"] = pa.array([[classes[i] for i in row] for row in indices], type=pa.list_(pa.string()))
    cols[value_column(probs)] = pa.array(values, type=pa.list_(pa.float64()))
    cols["head"] = pa.array([head] * n, type=pa.string())
    return pa.table(cols)


def failure_table(block: int, failed: Sequence[Tuple[str, str]]):
    """A pyarrow table of the inputs of ``block`` that could not be read: ``path``, ``reason``, ``block``."""
    import pyarrow as pa

    return pa.table({"path": pa.array([p for p, _ in failed], type=pa.string()),
                     "reason": pa.array([r for _, r in failed], type=pa.string()),
                     "block": pa.array([block] * len(failed), type=pa.int64())})


def usable_rows(x, keys: Dict[str, list], source: str):
    """``(x, keys, failed)`` without the embedding rows no head can score: a NaN or inf entry, or all zeros (which
    the single-process ``classify`` refuses in one line). Each is a failure named ``SOURCE[ROW]`` with its reason,
    so the rows of a block's part plus its failures still equal its inputs."""
    import torch

    nonfinite = ~torch.isfinite(x).all(dim=1)
    zero = ~nonfinite & (x.abs().amax(dim=1) == 0) if x.shape[1] else torch.ones(x.shape[0], dtype=torch.bool)
    bad = nonfinite | zero
    if not bool(bad.any()):
        return x, keys, []
    failed = [(f"{source}[{r}]", "NaN or inf in the embedding" if nonfinite[i] else
               "an all-zero embedding; cannot L2-normalise it")
              for i, r in enumerate(keys["row"]) if bad[i]]
    keep = (~bad).tolist()
    return x[~bad], {k: [v for v, ok in zip(vals, keep) if ok] for k, vals in keys.items()}, failed


def feature_keys(block: Block) -> Dict[str, list]:
    s = block.spec
    n = s["stop"] - s["start"]
    return {"index": list(range(s["id0"], s["id0"] + n)), "source": [s["file"]] * n,
            "row": list(range(s["start"], s["stop"]))}


def table_bytes(table) -> bytes:
    """A pyarrow table as the bytes of a Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()
