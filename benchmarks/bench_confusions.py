#!/usr/bin/env python
"""Benchmark: ``svgen diagnose --confusions`` — its time on LVIS, and how well it predicts measured confusions.

Fits (or loads, ``--artifact``) the LVIS zero-shot artifact of docs/usage.md (1,203 classes × K=4), then

* times ``svgen diagnose lvis.svgen --confusions`` as a user types it (a subprocess: wall and CPU time, start and
  artifact loading included), and :func:`svgen.evaluation.confusions.predicted_pairs` (top 20 pairs, blocks of
  classes) in-process against the stock dense computation: every support row's kernel-head probabilities at once
  (M×C) and the C×C table of class means, then its top 20; both must list the same pairs;
* on the LVIS dev half, the ranks of the measured pairs and the scores tried and dropped (docs/history.md);
* **the table** (``--table``; dev data only): for each set of the shared dev data — the LVIS dev half, each of the
  seven CoOp validation sets (text-like prototypes) and the seven as one 1,033-class problem (``all7``, labels
  offset set by set, as benchmarks/bench_adapt.py builds it) — text only, and for the CoOp sets also with 4 labelled
  shots per class drawn from val (seed 0; the rest of val measures): of the 20 most-confused pairs ``svgen eval
  --confusions`` measures (the default head's), how many are among the top 100 predicted from the support vectors,
  with a 95% bootstrap interval (the measured rows resampled, the prediction fixed), and with shots the figure over
  ``SHOT_DRAWS`` draws of the shots (seeds 0, 1, …: the interval holds the shots fixed). ``--alternatives`` adds the
  predictors tried and dropped, with paired bootstrap intervals of their difference. ``--write-docs`` puts the
  table into docs/usage.md;
* **the ceiling** (``--ceiling``; dev data only): what the data let any predictor reach. Each CoOp set and ``all7``,
  text only and with the table's shots: the measured pairs are taken on part of val (one row per class, as on the
  LVIS dev half; half of each class's rows; or one row per class that is the mean of half its rows, as an LVIS dev
  row is the mean of 25 exemplar crops; 10 seeded draws) and compared with the chosen prediction and with an oracle
  that knows the confusions: the top 100 pairs by the rate measured on the *other* rows of the same classes (rows of
  a called b over rows of a, times the measured rows of a; equal rates in random order). ``--write-docs`` puts this
  table into docs/usage.md too.

    .venv/bin/python -m benchmarks.bench_confusions [--artifact lvis.svgen] [--json]
    .venv/bin/python -m benchmarks.bench_confusions --table [--alternatives] [--write-docs]   # ~10 minutes, 2 cores
    .venv/bin/python -m benchmarks.bench_confusions --ceiling [--write-docs]                  # ~15 seconds
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from benchmarks.bench_common import (COOP_SETS, DATA, FEWSHOT, UNION, load_coop, machine, print_table,
                                      replace_between, sample, save_result)

WINDOW, MEASURED = 100, 20


def fit_lvis(out: Path) -> None:
    from svgen.cli import main

    code = main(["-q", "fit", "--prototypes", str(DATA / "lvis_v1_clip_a+cname.npy"), "--classes",
                 str(DATA / "lvis_classes.txt"), "-K", "4", "--out", str(out)])
    if code != 0:
        sys.exit(f"fit failed ({code})")


def dense_table(clf) -> torch.Tensor:
    """The stock way: all rows' probabilities (the default head's) at once, the C×C class-mean table by one product."""
    ss = clf.heads_.kernel.support_set()
    with torch.no_grad():
        p = torch.as_tensor(clf.predict_proba(ss.rows.float())).double()
    Y = torch.nn.functional.one_hot(ss.labels, len(clf.classes_)).double()
    return (Y.T @ p) / Y.sum(0).clamp_min(1)[:, None]


def top_pairs(table: torch.Tensor, n: int, among=None, symmetric: bool = False):
    t = table.clone()
    t.fill_diagonal_(-float("inf"))
    if among is not None:
        keep = torch.zeros(t.shape[0], dtype=torch.bool)
        keep[torch.as_tensor(among)] = True
        t[~keep] = -float("inf") if not symmetric else t[~keep]
        if symmetric:
            t[~keep[:, None] & ~keep[None, :]] = -float("inf")
    if symmetric:
        t = torch.triu(t, 1) + torch.tril(torch.full_like(t, -float("inf")))
    v, i = torch.topk(t.reshape(-1), n)
    C = t.shape[0]
    return [(int(j) // C, int(j) % C) for j in i]


def hits(measured, pairs) -> dict:
    directed = set(pairs)
    unordered = {(min(a, b), max(a, b)) for a, b in pairs}
    return {"directed": sum((m.a, m.b) in directed for m in measured),
            "unordered": sum((min(m.a, m.b), max(m.a, m.b)) in unordered for m in measured)}


def directed_ranks(table: torch.Tensor, measured, among) -> dict:
    """The rank (1 = most confusable) of each measured pair among the directed pairs whose true class is in
    ``among``."""
    t = table[torch.as_tensor(among)].clone()
    t[torch.arange(len(among)), torch.as_tensor(among)] = -float("inf")
    flat = t.reshape(-1)
    at = {int(c): i for i, c in enumerate(among)}
    ranks = [int((flat > t[at[m.a], m.b]).sum()) + 1 for m in measured]
    return {"of": int(len(among) * (table.shape[0] - 1)), "ranks": ranks}


def alternatives(clf) -> dict:
    """The scores tried before the chosen one (C×C tables; symmetric ones say so)."""
    from svgen.core.kernels import kernel

    kh = clf.heads_.kernel
    ss = kh.support_set()
    R = ss.rows.double()
    C = len(clf.classes_)
    Y = torch.nn.functional.one_hot(ss.labels, C).double()
    A = (kh.votes.to_dense() if kh.votes.is_sparse else kh.votes).double()
    K = kernel(R, R, kh.bandwidth, clf.kernel)
    G = Y.T @ K @ Y
    d = G.diagonal().clamp_min(1e-300).sqrt()
    KA = K @ A
    T = clf.heads_.calibration.temperatures["kernel"]
    P = torch.nn.functional.normalize(clf.prototypes_.double(), dim=-1)
    # an image has cosine ≈ 0.3 with its class's text: at such an input the RBF kernel is exp(0.3·(cos − 1)/σ²) up
    # to a factor per input, which the log-score logits cancel: the kernel head at "image-like" inputs, bandwidth σ/√0.3
    wide = kernel(R, R, kh.bandwidth / 0.3 ** 0.5, clf.kernel) @ A
    p_wide = torch.softmax(torch.log(wide.clamp_min(1e-30)) / T, 1)
    return {"cosine of the kernel mean embeddings of S_a, S_b (symmetric)": (G / d[:, None] / d[None, :], True),
            "mean vote for b at S_a, k(S_a, S)·A": ((Y.T @ KA) / Y.sum(0)[:, None], False),
            "mean softmax(vote / T) of b at S_a": ((Y.T @ torch.softmax(KA / T, 1)) / Y.sum(0)[:, None], False),
            "chosen, kernel widened to image-like inputs (σ/√0.3)": ((Y.T @ p_wide) / Y.sum(0)[:, None], False),
            "reference: cosine of the class prototypes (symmetric)": (P @ P.T, True)}


COOP = ("caltech101", "fgvc", "oxford_flowers", "oxford_pets", "stanford_cars", "sun397", "ucf101")
SHOTS, SEED, BOOT, SHOT_DRAWS = 4, 0, 1000, 5
USAGE = Path(__file__).resolve().parent.parent / "docs" / "usage.md"
BEGIN, END = "<!-- confusions table: begin -->", "<!-- confusions table: end -->"
CEILING_BEGIN, CEILING_END = "<!-- confusions ceiling: begin -->", "<!-- confusions ceiling: end -->"
DRAWS = 10


def cases(lvis_clf):
    """(data, setting, classifier, measured features, their labels) of every row of the table."""
    yield ("LVIS dev half", "text only", lvis_clf, np.load(DATA / "lvis_dev_image_features.npy").astype(np.float32),
           np.load(DATA / "lvis_dev_labels.npy"))
    for name in COOP + (UNION,):
        for k in (0, SHOTS):
            yield (name, f"{k} shots per class" if k else "text only") + coop_case(name, k, SEED)


def coop_case(name: str, k: int, seed: int) -> tuple:
    """(classifier, measured features, their labels): the default fit on a CoOp set's text-like prototypes with ``k``
    shots per class drawn from val (``seed``), the rest of val measured."""
    from svgen import SVGClassifier

    X, y, P = load_coop(name)
    X, P = X.astype(np.float32), P.astype(np.float32)
    shot, rest = sample(y, k, seed)
    clf = SVGClassifier().fit(P, classes=[f"c{i}" for i in range(len(P))], shots=(X[shot], y[shot]) if k else None)
    return clf, X[rest], y[rest]


def draw_hits(name: str, seed: int) -> int:
    """The chosen prediction's hits with ``SHOTS`` shots per class drawn with ``seed``."""
    from svgen.evaluation.confusions import measured_on, measured_pairs

    clf, X, y = coop_case(name, SHOTS, seed)
    pred, conf = measured_on(clf, torch.from_numpy(X), y)
    chosen = set(predictors(clf, y, False)["chosen"])
    return sum((m.a, m.b) in chosen for m in measured_pairs(y, pred, conf, MEASURED))


def predictors(clf, y, alternatives: bool) -> dict:
    """The top 100 predicted directed pairs of the chosen score, as ``svgen eval --confusions`` ranks them on labels
    ``y`` (expected rows n_a·conf(a → b)), and, with ``alternatives``, of the predictors tried and dropped (each over
    the pairs whose true class has rows in ``y``; those in ``BY_ROWS`` ranked by expected rows as the chosen one, the
    others by the share, as they were tried)."""
    from svgen.evaluation.confusions import predicted_pairs

    sizes = np.bincount(y, minlength=len(clf.class_names_))
    out = {"chosen": [(p.a, p.b) for p in predicted_pairs(clf, WINDOW, sizes=sizes)]}
    if alternatives:
        for name, table in alternative_predictors(clf).items():
            weight = torch.as_tensor(sizes, dtype=table.dtype)[:, None] if name in BY_ROWS else 1.0
            out[name] = top_pairs(table * weight, WINDOW, np.unique(y))
    return out


KERNEL_ALWAYS = "the kernel head's probabilities, whatever the default head"
BY_ROWS = {KERNEL_ALWAYS}


def alternative_predictors(clf) -> dict:
    """C×C tables of the predictors tried on the whole table: the share conf(a → b) alone, as ``diagnose`` ranks
    pairs without data (ranked here over the pairs these labels can show; the chosen ranking weighs it by the rows of
    a), the kernel head's probabilities at the rows whatever the default head (the score before it was the default
    head's), the kernel head's with each support row scored without its own vote (the kernel head at a point like s
    rather than at the support vector s, whose own vote favours its class), and the chosen score conditioned on not
    choosing a (p(b | s) / (1 − p(a | s)))."""
    from svgen.heads.calibration import softmax
    from svgen.heads import predictor
    from svgen.heads.scoring import kernel_scores, prior_probs

    kh = clf.heads_.kernel
    ss = kh.support_set()
    R, L = ss.rows.float(), ss.labels.long()
    C = len(clf.class_names_)
    Y = torch.nn.functional.one_hot(L, C).double()
    n = Y.sum(0).clamp_min(1)[:, None]
    with torch.no_grad():
        p = torch.as_tensor(clf.predict_proba(R)).double()
        p_kernel = torch.as_tensor(clf.predict_proba(R, head="kernel")).double()
        A = (kh.votes.to_dense() if kh.votes.is_sparse else kh.votes).float()
        s = kernel_scores(R, kh.rows, kh.bandwidth, kh.votes, clf.fit_config_.kernel) - A   # k(s, s) = 1: unit rows
        prior = prior_probs(R, clf.prototypes_, kh.prior_scale) if kh.prior_scale is not None else None
        s = s if prior is None else s + prior
        own = softmax(predictor.logits_of_scores(clf.heads_, s, "kernel", prior),
                      predictor.temperature(clf.heads_, "kernel")).double()
    p_a = p[torch.arange(len(L)), L]
    return {"the share alone, conf(a → b), not times the rows of a": (Y.T @ p) / n,
            KERNEL_ALWAYS: (Y.T @ p_kernel) / n,
            "each support row without its own vote": (Y.T @ own) / n,
            "conditioned on not a: p(b | s) / (1 − p(a | s))": (Y.T @ (p / (1 - p_a).clamp_min(1e-12)[:, None])) / n}


def measured_hits(y, pred, conf, predicted: dict, rng, boot: int) -> dict:
    """Per predictor: hits (of the 20 most-confused measured pairs, how many are predicted) and ``boot`` bootstrap
    replicates (rows resampled; the same resamples for every predictor: paired)."""
    from svgen.evaluation.confusions import measured_pairs

    predicted = {k: set(pairs) for k, pairs in predicted.items()}

    def count(idx):
        measured = measured_pairs(y[idx], pred[idx], conf[idx], MEASURED)
        return {k: sum((m.a, m.b) in pairs for m in measured) for k, pairs in predicted.items()}, measured

    full, measured = count(np.arange(len(y)))
    reps = [count(rng.integers(0, len(y), len(y)))[0] for _ in range(boot)]
    return {"hits": full, "boot": {k: np.array([r[k] for r in reps]) for k in predicted}, "measured": measured}


def interval(values) -> str:
    lo, hi = np.round(np.percentile(values, [2.5, 97.5])) + 0.0   # + 0.0: no "-0"
    return f"{lo:.0f} to {hi:.0f}" if lo < 0 else f"{lo:.0f}–{hi:.0f}"


def table_rows(lvis_clf, alternatives: bool, boot: int, log=print) -> tuple:
    from svgen.evaluation.confusions import measured_on

    rows, reps = [], {}
    rng = np.random.default_rng(SEED)
    for data, setting, clf, X, y in cases(lvis_clf):
        t0 = time.perf_counter()
        pred, conf = measured_on(clf, torch.from_numpy(X), y)
        predicted = predictors(clf, y, alternatives)
        got = measured_hits(y, pred, conf, predicted, rng, boot)
        counts = [m.count for m in got["measured"]]
        row = {"data": data, "classes": len(clf.class_names_), "setting": setting, "head": clf.default_head_,
               "rows": int(len(y)), "errors": int((pred != y).sum()),
               "pair counts": f"{counts[0]}–{counts[-1]}" if counts else "-", "hits": got["hits"]["chosen"],
               "interval": interval(got["boot"]["chosen"]),
               **{f"alt: {k}": v for k, v in got["hits"].items() if k != "chosen"}}
        if data == UNION:   # which set the pairs' true classes come from
            ends = np.cumsum([np.load(FEWSHOT / n / "textlike_prototypes.npy").shape[0] for n in COOP_SETS])
            of_set = [COOP_SETS[int(np.searchsorted(ends, a, side="right"))] for a in range(int(ends[-1]))]
            row["sets of the measured pairs"] = dict(Counter(of_set[m.a] for m in got["measured"]).most_common())
            row["sets of the predicted pairs"] = dict(Counter(of_set[a] for a, _ in predicted["chosen"]).most_common())
            log(f"  all7 {setting}: true classes of the {MEASURED} measured pairs by set "
                f"{row['sets of the measured pairs']}; of the top {WINDOW} predicted {row['sets of the predicted pairs']}")
        if setting != "text only":   # the shots drawn again: the interval above holds them fixed
            row["draws"] = [row["hits"]] + [draw_hits(data, SEED + d) for d in range(1, SHOT_DRAWS)]
        rows.append(row)
        reps[(data, setting)] = got["boot"]
        log(f"{data} {setting}: {row['hits']} of {MEASURED}{', draws ' + str(row['draws']) if 'draws' in row else ''} "
            f"({time.perf_counter() - t0:.0f} s)")
    for setting in ("text only", f"{SHOTS} shots per class"):   # the seven CoOp sets taken one by one, summed
        keys = [(d, setting) for d in COOP]
        total = {k: sum(reps[key][k] for key in keys) for k in reps[keys[0]]}
        mine = [r for r in rows if r["data"] in COOP and r["setting"] == setting]
        rows.append({"data": "7 CoOp sets, summed", "classes": sum(r["classes"] for r in mine), "setting": setting,
                     "head": "", "rows": sum(r["rows"] for r in mine), "errors": sum(r["errors"] for r in mine),
                     "pair counts": "", "hits": sum(r["hits"] for r in mine), "of": MEASURED * len(mine),
                     "interval": interval(total["chosen"]),
                     **({"draws": [int(v) for v in np.sum([r["draws"] for r in mine], axis=0)]} if "draws" in mine[0]
                        else {}),
                     **{k: sum(r[k] for r in mine) for k in mine[0] if k.startswith("alt: ")}})
        reps[("7 CoOp sets, summed", setting)] = total
    paired = {}
    for key, b in reps.items():   # each alternative minus the chosen score, same resamples
        for k in b:
            if k != "chosen":
                paired.setdefault(k, {})[f"{key[0]}, {key[1]}"] = interval(b[k] - b["chosen"])
    return rows, paired


MEASURED_ROWS = {1: "one row per class", "half": "half of each class's rows",
                 "mean": "one row per class, the mean of half its rows"}


def split_rows(y, per, rng) -> np.ndarray:
    """A mask of the rows taken to be measured: one row of every class with at least two (``per`` = 1), or half of
    each class's rows (``per`` = "half" or "mean"); the other rows are the oracle's."""
    picks = []
    for c in np.unique(y):
        rows = np.flatnonzero(y == c)
        if len(rows) > 1:
            picks.append(rng.choice(rows, 1 if per == 1 else len(rows) // 2, replace=False))
    mask = np.zeros(len(y), dtype=bool)
    mask[np.concatenate(picks)] = True
    return mask


def measured_rows(clf, X, y, pred, conf, taken, per):
    """(labels, top-1 class, its probability) of the measured rows: the rows ``taken``, or for ``per`` = "mean" one
    row per class, the re-normalised mean of its rows taken (as an LVIS dev row is the mean of 25 exemplar crops)."""
    from svgen.evaluation.confusions import measured_on

    if per != "mean":
        return y[taken], pred[taken], conf[taken]
    labels = np.unique(y[taken])
    means = np.stack([X[taken & (y == c)].mean(axis=0) for c in labels])
    means /= np.linalg.norm(means, axis=1, keepdims=True)
    return (labels, *measured_on(clf, torch.from_numpy(means.astype(np.float32)), labels))


def oracle_pairs(y, pred, other, sizes, rng) -> set:
    """The top 100 directed pairs by the confusion rate measured on the rows ``other``, times the measured rows of a
    (``sizes``, as the chosen ranking weighs conf(a → b)); equal values in random order."""
    C = len(sizes)
    wrong = other & (pred != y)
    rate = np.zeros((C, C))
    np.add.at(rate, (y[wrong], pred[wrong]), 1.0)
    rate = rate / np.maximum(np.bincount(y[other], minlength=C), 1)[:, None] * sizes[:, None]
    np.fill_diagonal(rate, -np.inf)
    rate[sizes == 0] = -np.inf
    order = np.lexsort((rng.random(C * C), -rate.reshape(-1)))[:WINDOW]
    return {(int(i) // C, int(i) % C) for i in order}


def ceiling_rows(draws: int = DRAWS, log=print) -> list:
    """Per CoOp set and ``all7``, text only and with shots (the table's draw), for each way of measuring in
    ``MEASURED_ROWS``: the mean hits (of the 20 measured pairs, among the top 100) of the chosen prediction and of the
    oracle over ``draws`` draws of the measured rows."""
    from svgen.evaluation.confusions import measured_on, measured_pairs, predicted_pairs

    rows = []
    for name, k in ((n, k) for k in (0, SHOTS) for n in COOP + (UNION,)):
        clf, X, y = coop_case(name, k, SEED)
        C = len(clf.class_names_)
        pred, conf = measured_on(clf, torch.from_numpy(X), y)
        for per in MEASURED_ROWS:
            rng = np.random.default_rng(SEED)
            chosen, oracle = [], []
            for _ in range(draws):
                taken = split_rows(y, per, rng)
                labels, p, c = measured_rows(clf, X, y, pred, conf, taken, per)
                measured = measured_pairs(labels, p, c, MEASURED)
                sizes = np.bincount(labels, minlength=C)
                mine = {(q.a, q.b) for q in predicted_pairs(clf, WINDOW, sizes=sizes)}
                best = oracle_pairs(y, pred, ~taken, sizes, rng)
                chosen.append(sum((q.a, q.b) in mine for q in measured))
                oracle.append(sum((q.a, q.b) in best for q in measured))
            rows.append({"data": name, "classes": C, "fit": f"{k} shots per class" if k else "text only",
                         "measured": MEASURED_ROWS[per], "chosen": float(np.mean(chosen)),
                         "oracle": float(np.mean(oracle))})
            log(f"{name}, {rows[-1]['fit']}, {rows[-1]['measured']}: chosen {rows[-1]['chosen']:.1f}, "
                f"oracle {rows[-1]['oracle']:.1f}")
    for fit, per in ((f, p) for f in ("text only", f"{SHOTS} shots per class") for p in MEASURED_ROWS.values()):
        mine = [r for r in rows if r["data"] in COOP and r["fit"] == fit and r["measured"] == per]
        rows.append({"data": "7 CoOp sets, summed", "classes": sum(r["classes"] for r in mine), "fit": fit,
                     "measured": per, "chosen": sum(r["chosen"] for r in mine), "oracle": sum(r["oracle"] for r in mine),
                     "of": MEASURED * len(mine)})
    return rows


def ceiling_markdown(rows, draws: int) -> str:
    lines = [f"| data (dev only) | classes | fit | rows measured | of the {MEASURED} measured pairs, among the "
             f"top {WINDOW} predicted from the support vectors | among the top {WINDOW} of the oracle (the other "
             f"rows' confusions) |", "|---|---:|---|---|---:|---:|"]
    for r in rows:
        of = r.get("of", MEASURED)
        lines.append(f"| {r['data']} | {r['classes']:,} | {r['fit']} | {r['measured']} | {r['chosen']:.1f} of {of} | "
                     f"{r['oracle']:.1f} of {of} |")
    return "\n".join(lines) + (f"\n\nMeans over {draws} draws of the measured rows. Generated by `python -m "
                               f"benchmarks.bench_confusions --ceiling --write-docs` (dev data only).")


def markdown(rows, load) -> str:
    lines = [f"| data (dev only) | classes | fit | default head (measured) | rows measured | errors | rows per "
             f"measured pair (most–least) | of the {MEASURED} measured pairs, among the top {WINDOW} predicted | 95% "
             f"bootstrap interval (rows resampled) | over {SHOT_DRAWS} draws of the shots: mean (least–most) |",
             "|---|---:|---|---|---:|---:|---|---:|---|---|"]
    for r in rows:
        of = r.get("of", MEASURED)
        draws = f"{np.mean(r['draws']):.1f} ({min(r['draws'])}–{max(r['draws'])})" if "draws" in r else "—"
        lines.append(f"| {r['data']} | {r['classes']:,} | {r['setting']} | {r['head'] or '—'} | {r['rows']:,} | "
                     f"{r['errors']:,} | {r['pair counts'] or '—'} | **{r['hits']} of {of}** | {r['interval']} | "
                     f"{draws} |")
    return "\n".join(lines) + (f"\n\nGenerated by `python -m benchmarks.bench_confusions --table --write-docs` "
                               f"(dev data only; load average {load:.1f}).")


def write_docs(text: str, begin: str = BEGIN, end: str = END) -> None:
    if not replace_between(USAGE, begin, end, text + "\n"):
        sys.exit(f"{USAGE} has no {begin} … {end} markers")


def cli_time(art: Path) -> dict:
    """``svgen diagnose ART --confusions`` as a user types it: wall and CPU seconds of the subprocess."""
    import resource
    import subprocess

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "svgen.cli", "diagnose", str(art), "--confusions"],
                         capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode:
        sys.exit(f"svgen diagnose failed: {out.stderr.strip()}")
    listed = sum(1 for line in out.stdout.splitlines() if line.strip()[:1].isdigit())
    return {"wall_s": wall, "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
            "pairs_listed": listed, "load_average_1m": round(os.getloadavg()[0], 2)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    ap.add_argument("--artifact", help="an LVIS artifact already fit as in docs/usage.md (else fit one, ~15 s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the tables")
    ap.add_argument("--table", action="store_true", help="the table over the shared dev data (LVIS, CoOp, all7)")
    ap.add_argument("--alternatives", action="store_true", help="with --table: the predictors tried and dropped too")
    ap.add_argument("--ceiling", action="store_true", help="what the data let any predictor reach (an oracle)")
    ap.add_argument("--write-docs", action="store_true", help="with --table or --ceiling: write it into docs/usage.md")
    ap.add_argument("--boot", type=int, default=BOOT, help="bootstrap resamples (default %(default)s)")
    args = ap.parse_args(argv)
    if not (DATA / "lvis_dev_image_features.npy").is_file():
        sys.exit(f"{DATA} is absent: this benchmark needs the shared LVIS embeddings")
    if args.ceiling:
        rows = ceiling_rows()
        text = ceiling_markdown(rows, DRAWS)
        path = save_result("confusions_ceiling", {"rows": rows, "draws": DRAWS, "window": WINDOW,
                                                  "machine": machine()})
        print(json.dumps(rows, indent=2) if args.json else text)
        if args.write_docs:
            write_docs(text, CEILING_BEGIN, CEILING_END)
            print(f"wrote the ceiling into {USAGE}")
        print(f"wrote {path}")
        return
    from svgen import SVGClassifier
    from svgen.evaluation.confusions import measured_on, measured_pairs, predicted_pairs

    with tempfile.TemporaryDirectory() as tmp:
        art = Path(args.artifact) if args.artifact else Path(tmp) / "lvis.svgen"
        if not args.artifact:
            fit_lvis(art)
        clf = SVGClassifier.load(art)
        if args.table:
            load = os.getloadavg()[0]
            rows, paired = table_rows(clf, args.alternatives, args.boot)
            text = markdown(rows, load)
            path = save_result("confusions_table", {"rows": rows, "paired": paired, "window": WINDOW,
                                                    "boot": args.boot, "machine": machine()})
            print(json.dumps({"rows": rows, "paired": paired}, indent=2) if args.json else text)
            if args.alternatives:
                for k, v in paired.items():
                    print(f"\n{k} minus chosen, paired 95% bootstrap interval of the difference in hits:")
                    for where, iv in v.items():
                        print(f"  {where}: {iv}")
            if args.write_docs:
                write_docs(text)
                print(f"wrote the table into {USAGE}")
            print(f"wrote {path}")
            return
        cli = cli_time(art)
    ss = clf.heads_.kernel.support_set()
    t0, c0 = time.perf_counter(), time.process_time()
    ours = predicted_pairs(clf, MEASURED)
    t_ours, c_ours = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    table = dense_table(clf)
    stock = top_pairs(table, MEASURED)
    t_stock, c_stock = time.perf_counter() - t0, time.process_time() - c0
    same = [(p.a, p.b) for p in ours] == stock

    x = np.load(DATA / "lvis_dev_image_features.npy")
    y = np.load(DATA / "lvis_dev_labels.npy")
    pred, conf = measured_on(clf, x, y)
    measured = measured_pairs(y, pred, conf, MEASURED)
    present = np.unique(y)
    rows = [{"score": f"chosen: mean {clf.default_head_}-head probability of b at S_a (the default head)", "over": over,
             **hits(measured, top_pairs(table, WINDOW, among))}
            for over, among in (("all pairs", None), ("true class labelled", present))]
    for name, (t, sym) in alternatives(clf).items():
        for over, among in (("all pairs", None), ("true class labelled", present)):
            rows.append({"score": name, "over": over, **hits(measured, top_pairs(t, WINDOW, among, symmetric=sym))})
    ranks = directed_ranks(table, measured, present)
    result = {"artifact": f"LVIS zero-shot, {len(clf.classes_)} classes × K={clf.fit_config_.n_support}, "
                          f"{len(ss)} support rows",
              "cli": cli,
              "top20_s": {"svgen (blocks of classes)": t_ours, "dense M×C then C×C (stock)": t_stock,
                          "ratio": t_ours / t_stock, "same_pairs": same},
              "top20_cpu_s": {"svgen (blocks of classes)": c_ours, "dense M×C then C×C (stock)": c_stock},
              "measured_pair_ranks": {"of_directed_pairs": ranks["of"], "ranks": ranks["ranks"],
                                      "median": float(np.median(ranks["ranks"])) if ranks["ranks"] else None},
              "measured": {"n": int(len(y)), "errors": int((pred != y).sum()),
                           "counts_of_top20": [m.count for m in measured]},
              "window": WINDOW, "hits_of_20": rows, "machine": machine()}
    path = save_result("confusions", result)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"svgen diagnose --confusions (a subprocess, as typed): {cli['pairs_listed']} pairs in {cli['wall_s']:.1f} s "
          f"wall, {cli['cpu_s']:.1f} s CPU (load average {cli['load_average_1m']})")
    print(f"{result['artifact']}: top {MEASURED} pairs in {t_ours:.2f} s (svgen, blocks) vs {t_stock:.2f} s "
          f"(dense stock), ratio {t_ours / t_stock:.2f}, same pairs: {same}")
    print(f"CPU time: {c_ours:.2f} s (svgen) vs {c_stock:.2f} s (stock)")
    print(f"ranks of the measured pairs among the {ranks['of']} directed pairs with a labelled true class (chosen "
          f"score): median {result['measured_pair_ranks']['median']:.0f}, {sorted(ranks['ranks'])}")
    print(f"measured on {len(y)} dev rows: {result['measured']['errors']} errors; counts of the top {MEASURED} "
          f"measured pairs: {result['measured']['counts_of_top20']}")
    print_table(rows, ["score", "over", "directed", "unordered"],
                title=f"of the {MEASURED} most-confused measured pairs, how many are among the top {WINDOW} predicted")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
