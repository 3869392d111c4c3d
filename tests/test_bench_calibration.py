"""The calibration benchmark's rows and report on small synthetic inputs (the real run needs ../shared/data)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def test_bench_rows_and_report():
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec = importlib.util.spec_from_file_location("bench_calibration", SCRIPTS / "bench_calibration.py")
        bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(bench)
    finally:
        sys.path.remove(str(SCRIPTS))
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(10, 32))
    emb = (centres[:, None] + 0.3 * rng.normal(size=(10, 2, 32))).astype(np.float32)
    y = rng.integers(0, 10, 80)
    x = (centres[y] + 1.5 * rng.normal(size=(80, 32))).astype(np.float32)
    bench.BOOT = 50
    rows, extra, fits = bench.run({"T=2": emb, "CxD": emb[:, 0]}, x, y)
    assert [(r["input"], r["head"]) for r in rows] == [(i, h) for i in ("T=2", "CxD") for h in bench.HEADS]
    for r in rows:
        assert 0 <= r["ece"] <= 1 and r["nll"] > 0 and r["temperature"] > 0
        if r["head"] != "cosine":
            lo, hi = r["ci95"]
            assert lo <= hi
    assert fits["CxD"]["temperatures"]["cosine"] == 1.0
    opt = [r for r in extra if "NLL-optimal" in r["head"]]
    used = {(r["input"], r["head"]): r for r in rows}
    for r in opt:  # the dev-label optimum is never worse in NLL than the text rule (it is the minimiser)
        assert r["nll"] <= used[(r["input"], r["head"].split(",")[0])]["nll"] + 1e-9
    text = bench.markdown(rows, extra, fits, {"date": "today", "machine": {"cpus": 2, "load_average_1m": 0.0}})
    assert "| CxD | kernel |" in text and ("met" in text or "missed" in text)
