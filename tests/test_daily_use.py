"""The daily user's svgen (issue 23) and svgen's output files (issue 24, items 3, 8, 10).

One section per item: vocabularies with repeated names, output formats by suffix and one
output schema, usage errors, the scikit-learn reflex, ``diagnose`` on adapted artifacts,
built-in template sets, the fit's cost, small items.
"""

from __future__ import annotations

import csv
import io
import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.errors import SvgenError

ROOT = Path(__file__).resolve().parent.parent
D = 16


def strict_json(text):
    def bad(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=bad)


def _one_line_error(code, out, err, *expected):
    assert code == 2, (code, err)
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in expected:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def _openai_style(C=8, T=3, seed=0):
    """C×T×D prompt embeddings and C names where, as in OpenAI's ImageNet list, two names are
    repeated and their rows are identical (the same prompts, encoded alike)."""
    rng = np.random.default_rng(seed)
    emb = rng.normal(size=(C, T, D)).astype(np.float32)
    names = [f"class {i}" for i in range(C)]
    emb[5] = emb[1]
    names[5] = names[1] = "missile"
    emb[7] = emb[3]
    names[7] = names[3] = "sunglasses"
    return emb, names


@pytest.fixture
def vocab_files(tmp_path):
    emb, names = _openai_style()
    np.save(tmp_path / "P.npy", emb)
    (tmp_path / "classes.txt").write_text("\n".join(names) + "\n")
    rng = np.random.default_rng(1)
    np.save(tmp_path / "feats.npy", rng.normal(size=(10, D)).astype(np.float32))
    return tmp_path


# ----------------------------------------------------------------------------- 1. repeated class names

def test_openai_style_duplicate_rows_fit_with_one_warning_and_the_cosine_head_is_clip(caplog):
    emb, names = _openai_style()
    with caplog.at_level(logging.WARNING, logger="svgen"):
        clf = SVGClassifier(n_support=2).fit(emb, classes=names)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warned) == 1, warned
    assert "'missile'" in warned[0] and "'sunglasses'" in warned[0] and "2 pair(s)" in warned[0]
    assert "[1] and" in warned[0] and "[5]" in warned[0]  # the pairs are named by row
    x = torch.from_numpy(np.random.default_rng(2).normal(size=(6, D)).astype(np.float32))
    E = torch.from_numpy(emb)
    P = (E / E.norm(dim=-1, keepdim=True)).mean(1)  # open_clip's build_zero_shot_classifier
    P = P / P.norm(dim=1, keepdim=True)
    x_hat = x / x.norm(dim=1, keepdim=True)
    torch.testing.assert_close(clf.decision_function(x, head="cosine"), 100 * x_hat @ P.T, rtol=1e-5, atol=1e-4)
    for head in ("kernel", "linear"):
        s = clf.decision_function(x, head=head)
        assert torch.isfinite(s).all(), head
        torch.testing.assert_close(s[:, 1], s[:, 5])  # identical classes tie under every head
    assert clf.classes_ == names


def test_strict_refuses_repeated_names_and_coinciding_prototypes():
    emb, names = _openai_style()
    with pytest.raises(SvgenError, match="identical or near-identical"):
        SVGClassifier(n_support=2, strict=True).fit(emb, classes=names)
    distinct = [f"c{i}" for i in range(len(names))]
    with pytest.raises(SvgenError, match="identical or near-identical"):  # same rows, distinct names
        SVGClassifier(n_support=2, strict=True).fit(emb, classes=distinct)
    emb2 = np.random.default_rng(5).normal(size=emb.shape).astype(np.float32)
    with pytest.raises(SvgenError, match="duplicate class name"):  # distinct rows, repeated names
        SVGClassifier(n_support=2, strict=True).fit(emb2, classes=names)


def test_cli_fit_warns_once_and_fits_strict_refuses(cli, vocab_files, caplog):
    f = vocab_files
    with caplog.at_level(logging.WARNING, logger="svgen"):
        code, out, err = cli("fit", "--prototypes", f / "P.npy", "--classes", f / "classes.txt", "-K", "2",
                             "--out", f / "a.svgen")
    assert code == 0, err
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 1 and "'missile'" in lines[0] and "--strict" in lines[0], lines
    assert json.loads((f / "a.svgen" / "svgen.json").read_text())["classes"].count("missile") == 2
    code, out, err = cli("classify", f / "a.svgen", "--features", f / "feats.npy", "--top-k", "3")
    assert code == 0, err
    _one_line_error(*cli("fit", "--prototypes", f / "P.npy", "--classes", f / "classes.txt", "-K", "2",
                         "--strict", "--out", f / "b.svgen"), "duplicate", "'missile'")
    assert not (f / "b.svgen").exists()
