"""Write the golden artifacts in ``tests/io/golden/`` (run once, from the repository root, when a format changes on purpose).

    python tests/io/golden/make_golden.py                 # every case, and the real-data summary
    python tests/io/golden/make_golden.py CASE …          # only these cases (a new one: the others stay as written)
    python tests/io/golden/make_golden.py real            # only the real-data summary

Each case is a small synthetic problem (6 classes, 3 templates, D = 16) fitted by the code of the day and saved
through :meth:`svgen.SVGClassifier.save`. Next to the artifact, ``case.json`` records how it was made and what it
covers (format version, support sources, transductive verdict); ``queries.npy`` holds 24 query embeddings and
``proba_<head>.npy`` what ``predict_proba`` gave for them on every head, ``proba_default.npy`` with no head named.
``tests/io/test_golden.py`` checks that every artifact still loads to those probabilities and that refitting the same
case writes the same files (timings aside). Arrays are plain ``.npy`` (``allow_pickle=False``); nothing is pickled.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
D, C, T, N_QUERIES = 16, 6, 3, 24


def problem(seed: int = 0):
    """Class directions, text prototypes near them (C×T×D), and image sampler around the class directions."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(C, D))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    text = centres[:, None, :] + 0.35 * rng.normal(size=(C, T, D))

    def images(n_per_class: int, spread: float = 0.6):
        y = np.repeat(np.arange(C), n_per_class)
        x = centres[y] + spread * rng.normal(size=(len(y), D)) / np.sqrt(D) * 2
        return x.astype(np.float32), y.astype(np.int64)

    return text.astype(np.float32), images


def build(name: str):
    """(classifier, description) for one golden case, fitted from scratch (deterministic)."""
    import svgen

    text, images = problem(3 if "one_shot" in name else 0)   # seed 3: a one-shot problem whose pool is kept
    classes = [f"class {i}" for i in range(C)]
    fit = dict(n_support=2, seed=0)
    clf = svgen.SVGClassifier(**fit)
    if name == "v1_zero_shot":
        clf.fit(text, classes=classes)
    elif name == "v1_local_votes":
        clf = svgen.SVGClassifier(**fit, vote_solver="local", vote_neighbours=4).fit(text, classes=classes)
    elif name == "v1_pool_refused":
        U, _ = images(1)
        clf.fit(text, classes=classes).adapt(unlabelled=U[:4])
    elif name == "v6_zero_shot_pool_kept":   # the kernel head × the pool's likelihood: format 6 without shots
        U, _ = images(40)
        clf.fit(text, classes=classes).adapt(unlabelled=U)
    elif name == "v2_shots_refused":   # format 2: shot rows with zero votes (the correction refused on the folds)
        import dataclasses
        from unittest import mock

        from svgen.adapt import residual

        X, y = images(3)
        refuse = lambda *a, **k: dataclasses.replace(decide(*a, **k), chosen=residual.ZERO_SHOT, index=0)  # noqa: E731
        decide = residual.choose   # a format fixture: the kernel head's choice made zero-shot
        with mock.patch.object(residual, "choose", refuse):
            clf.fit(text, classes=classes).adapt(X, y)
    elif name == "v4_shots":   # the mixture head: format 4
        X, y = images(4)
        clf.fit(text, classes=classes).adapt(X, y)
    elif name in ("v4_shots_pool_refused", "v6_shots_pool_kept"):   # a kept pool multiplies heads: format 6
        X, y = images(4)
        U, _ = images(5 if name.endswith("refused") else 120)   # 120: kept by the exact sign test
        clf.fit(text, classes=classes).adapt(X, y, unlabelled=U)
    elif name == "v5_shots_for_some_classes":   # shots for 4 of the 6 classes: the mixture tilts the other 2
        X, y = images(4)
        keep = y < 4
        clf.fit(text, classes=classes).adapt(X[keep], y[keep])
    elif name in ("v3_one_shot", "v6_one_shot_pool_kept"):   # one shot per class: no within-class scatter
        X, y = images(1)
        U, _ = images(80)
        clf.fit(text, classes=classes).adapt(X, y, unlabelled=None if name == "v3_one_shot" else U)
    else:
        raise KeyError(name)
    return clf


CASES = ("v1_zero_shot", "v1_local_votes", "v1_pool_refused", "v6_zero_shot_pool_kept", "v2_shots_refused", "v4_shots",
         "v4_shots_pool_refused", "v6_shots_pool_kept", "v3_one_shot", "v6_one_shot_pool_kept",
         "v5_shots_for_some_classes")
# Written by an earlier svgen and never rewritten here (main() leaves them alone): they must keep loading to the
# probabilities and the default head they were saved with. legacy_v3_shots: format 3, the default head chosen by
# held-out accuracy (before the mixture head). v2_pool_rows: a zero-shot pool whose kernel vote was re-solved with
# pool rows (format 2, pool support rows; the code of the day gives the kernel head the pool's factor instead).
# legacy_v6_shots_pool_kept: v6_shots_pool_kept as written before the linear head's LDA part was stored (``lda.*``);
# loading refits it from the shots and the ``fewshot.linear`` record.
LEGACY = ("legacy_v3_shots", "v2_pool_rows", "legacy_v6_shots_pool_kept")


def queries() -> np.ndarray:
    _, images = problem(1)
    x, _ = images(N_QUERIES // C)
    return x


def describe(clf) -> dict:
    meta = clf.metadata()
    td = meta.get("transductive") or {}
    sources = sorted({int(s) for s in clf.support_set_.source.tolist()})
    return {"format_version": meta.get("format_version", 1), "support_sources": sources,
            "default_head": clf.default_head_,
            "transductive": None if not td else ("refused: " + td["fallback"] if td.get("fallback") else "kept"),
            "kernel_adopted": clf.kernel_prior_ is not None}


REAL_SET = "oxford_pets"
REAL_CASES = ("zero_shot", "shots_2", "shots_1_pool", "zero_shot_pool")


def real_case(data: Path, name: str):
    """(classifier, queries, labels) for a fixed-seed case on real CLIP features: pets' text-like prototypes,
    shots and queries from its validation images (``../shared/data``, never copied here)."""
    import svgen

    d = data / "clip-vit-b32" / "coop-fewshot" / REAL_SET
    P = np.load(d / "textlike_prototypes.npy")
    X, y = np.load(d / "val_features.npy"), np.load(d / "val_labels.npy")
    k = {"shots_2": 2, "shots_1_pool": 1}.get(name, 0)
    rng = np.random.default_rng(0)
    shots = np.concatenate([rng.permutation(np.flatnonzero(y == c))[:k] for c in range(P.shape[0])]).astype(int)
    rest = np.setdiff1d(np.arange(len(y)), shots)
    clf = svgen.SVGClassifier(seed=0).fit(P)
    if k:
        clf.adapt(X[shots], y[shots])
    if name.endswith("_pool"):
        clf.adapt(unlabelled=X[rest])
    return clf, X[rest], y[rest]


def real_summary(clf, q, y) -> dict:
    """What a prediction-preserving change must keep: per head, the SHA-256 of the predicted classes, top-1 and
    the mean NLL (4 decimals), and the default head's name."""
    import hashlib

    out = {"default_head": clf.default_head_}
    for head in ("kernel", "linear", "cosine", "default"):
        p = np.asarray(clf.predict_proba(q, head=None if head == "default" else head), dtype=np.float64)
        pred = p.argmax(axis=1).astype(np.int64)
        out[head] = {"argmax_sha256": hashlib.sha256(pred.tobytes()).hexdigest(),
                     "top1": round(float((pred == y).mean()), 4),
                     "nll": round(float(-np.log(np.clip(p[np.arange(len(y)), y], 1e-300, None)).mean()), 4)}
    return out


def main(names=CASES) -> None:
    """Write the cases ``names`` (every case by default; ``python make_golden.py NAME …``: those only) and the real-data
    summary (only with every case)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(HERE.parents[2]))   # the repository
    import torch

    torch.set_num_threads(1)
    q = queries()
    real_only = tuple(names) == ("real",)
    for name in () if real_only else names:
        clf = build(name)
        out = HERE / name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        clf.save(out / "artifact")
        np.save(out / "queries.npy", q, allow_pickle=False)
        for head in ("kernel", "linear", "cosine"):
            np.save(out / f"proba_{head}.npy", np.asarray(clf.predict_proba(q, head=head), dtype=np.float64),
                    allow_pickle=False)
        np.save(out / "proba_default.npy", np.asarray(clf.predict_proba(q), dtype=np.float64), allow_pickle=False)
        (out / "case.json").write_text(json.dumps({"case": name, **describe(clf)}, indent=2) + "\n")
        print(name, describe(clf))
    data = HERE.parents[3] / "shared" / "data"   # ../shared/data beside the repository
    if data.is_dir() and (tuple(names) == CASES or real_only):
        real = {name: real_summary(*real_case(data, name)) for name in REAL_CASES}
        (HERE / f"real_{REAL_SET}.json").write_text(json.dumps(real, indent=2) + "\n")
        print(json.dumps(real, indent=1))


if __name__ == "__main__":
    main(tuple(sys.argv[1:]) or CASES)
