"""The command line's feedback, pipes, output names and small items (issue 40, items 4, 13, 15 and 16).

One section per item: ``-v`` logs every long step with its time (``-q`` none, stdout stays the result), a closed
stdout ends quietly with exit 0, ``classify --out`` needs a known suffix in both engines, and the small items: the
help examples, ``adapt -q``, ``-K``/``-k``, ``--features F ART``, ``python -m svgen`` and ``class_log_factor``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from svgen import SVGClassifier

from conftest import one_line_error, strict_json

ROOT = Path(__file__).resolve().parents[2]
C, D = 6, 16
NAMES = [f"class {i}" for i in range(C)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("issue40")
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(C, 3, D)).astype(np.float32)
    np.save(root / "P.npy", protos)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    np.save(root / "X.npy", rng.normal(size=(12, D)).astype(np.float32))
    np.save(root / "big.npy", rng.normal(size=(20000, D)).astype(np.float32))  # ≈ 2 MB of CSV: more than a pipe holds
    y = np.repeat(np.arange(C), 2)
    np.save(root / "y.npy", y.astype(np.int64))
    SVGClassifier(n_support=2).fit(protos, classes=NAMES).save(root / "a.svgen")
    return root


def _svgen(*argv, cwd=None, **kw):
    """``python -m svgen ARGV`` in a fresh process (what a shell runs): (exit status, stdout, stderr)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("SVGEN_PROGRESS", None)
    p = subprocess.run([sys.executable, "-m", "svgen", *map(str, argv)], capture_output=True, text=True, env=env,
                       cwd=cwd, timeout=300, **kw)
    return p.returncode, p.stdout, p.stderr


# ----------------------------------------------------------------------------- 4. -v logs each step with its time

STEP_LINE = re.compile(r"^svgen \[\s*\d+\.\ds\] INFO: (.+) in \d+\.\d\ds$")


def test_verbose_fit_logs_each_step_with_its_time_and_quiet_logs_nothing(files, tmp_path):
    fit = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2")
    code, out, err = _svgen("-v", *fit, "--out", tmp_path / "v.svgen")
    assert code == 0, err
    assert set(strict_json(out)) >= {"sigma", "ridge_lambda"}   # stdout: the one JSON object, nothing else
    steps = [m.group(1) for m in map(STEP_LINE.match, err.splitlines()) if m]
    for step in ("fit: support vector generator", "fit: vote weights", "fit: metrics",
                 "fit: temperatures from the text side", f"artifact {tmp_path / 'v.svgen'} checked and written"):
        assert any(s.startswith(step) for s in steps), (step, err)
    assert "wrote" in err.splitlines()[-1]
    code, out_q, err_q = _svgen("-q", *fit, "--out", tmp_path / "q.svgen")
    assert code == 0 and err_q == "" and strict_json(out_q).keys() == strict_json(out).keys()
    code, out_0, err_0 = _svgen(*fit, "--out", tmp_path / "plain.svgen")   # no flag: the 'wrote' line only
    assert code == 0 and err_0.splitlines() == [f"wrote {tmp_path / 'plain.svgen'}: {C} classes × K=2, D={D}"]


def test_verbose_diagnose_and_adapt_log_their_steps(cli, files, tmp_path, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="svgen"):
        assert cli("-v", "diagnose", files / "a.svgen")[0] == 0
        code, _, err = cli("adapt", files / "a.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                           files / "y.npy", "--unlabelled-features", files / "X.npy", "--out", tmp_path / "b.svgen",
                           "-v")
    assert code == 0, err
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    for step in ("diagnose: kernel matrix K_SS", "diagnose: spectrum of K_SS", "adapt: kernel head, σ and ridge",
                 "adapt: linear head", "adapt: temperatures", "adapt: default head chosen", "pool check ("):
        assert any(s.startswith(step) and re.search(r" in \d+\.\d\ds$", s) for s in said), (step, said)


# ----------------------------------------------------------------------------- 13. a closed pipe: exit 0, quietly

def test_a_reader_that_stops_early_ends_classify_quietly_with_status_0(files):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    p = subprocess.Popen([sys.executable, "-m", "svgen", "classify", str(files / "a.svgen"), "--features",
                          str(files / "big.npy")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    first = p.stdout.readline()   # `| head -1`: one line read, then the pipe is closed
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=300) == 0, err
    assert first.startswith(b"index,source,row,label_1") and err == ""


# ----------------------------------------------------------------------------- 15. --out needs a known suffix

@pytest.mark.parametrize("name, extra", [("mycode.py", ["--force"]), ("preds", []), ("preds.txt", ["--format", "csv"])])
def test_local_classify_refuses_an_out_without_a_prediction_suffix(cli, files, tmp_path, name, extra):
    out = tmp_path / name
    if name.endswith(".py"):
        out.write_text("print('my code')\n")
    line = one_line_error(*cli("classify", files / "a.svgen", "--features", files / "X.npy", "--out", out, *extra),
                          f"--out {out}", ".csv, .jsonl (.ndjson) or .parquet")
    assert ("unknown suffix" if out.suffix else "no suffix") in line
    assert (out.read_text() == "print('my code')\n") if name.endswith(".py") else not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ([name] if name.endswith(".py") else [])


@pytest.mark.parametrize("name", ["x.csv", "x.jsonl", "x.py"])
def test_ray_classify_refuses_an_out_named_like_a_file_before_ray_starts(cli, files, tmp_path, monkeypatch, name):
    from svgen.engine import ray as ray_engine

    monkeypatch.setattr(ray_engine, "connect", lambda *a, **k: pytest.fail("Ray was started"))
    out = tmp_path / name
    one_line_error(*cli("classify", files / "a.svgen", "--features", files / "X.npy", "--engine", "ray", "--out", out),
                   f"--out {out}", "folder of Parquet parts", "FOLDER.parquet")
    assert not out.exists() and list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- 16. smaller items

def _examples():
    from svgen.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, p in sub.choices.items():
        for line in (p.epilog or "").splitlines():
            if line.strip().startswith("svgen "):
                yield name, shlex.split(line.split("#")[0])[1:]


def test_every_help_example_parses_and_a_head_named_in_its_out_is_the_head_it_writes():
    from svgen.cli import build_parser, parse_args

    examples = list(_examples())
    assert {name for name, _ in examples} >= {"classify", "export", "adapt", "eval"}
    for name, argv in examples:
        args = parse_args(build_parser(), argv)   # an unknown or misspelt option exits here
        out = getattr(args, "out", None) or ""
        named = [h for h in ("linear", "kernel", "cosine", "mixture") if f"-{h}." in Path(out).name]
        assert getattr(args, "head", None) in named if named else True, (name, argv)


def test_the_export_help_example_writes_the_linear_head(cli, files, tmp_path, monkeypatch):
    from safetensors import safe_open

    argv = next(a for name, a in _examples() if name == "export" and "safetensors" in a)
    monkeypatch.chdir(tmp_path)
    os.symlink(files / "a.svgen", tmp_path / argv[1])   # lvis.svgen: the example's artifact
    code, _, err = cli(*argv)
    assert code == 0, err
    with safe_open(str(tmp_path / argv[argv.index("--out") + 1]), framework="numpy") as f:
        assert {"weight", "bias", "logit_scale"} <= set(f.keys()) and "support_vectors" not in f.keys()
        assert f.metadata()["head"] == "linear"


def test_adapt_prints_its_json_result_as_fit_does_and_quiet_silences_only_stderr(cli, files, tmp_path):
    code, out, err = cli("-q", "adapt", files / "a.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                         files / "y.npy", "--out", tmp_path / "b.svgen")
    assert code == 0 and err == ""
    assert strict_json(out)["default_head"] in ("kernel", "linear", "mixture") and out.count("\n") == 1
    code, out2, err2 = cli("adapt", files / "a.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                           files / "y.npy", "--out", tmp_path / "c.svgen")
    assert code == 0 and out2 == out and err2.startswith(f"wrote {tmp_path / 'c.svgen'}")
    from svgen.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    assert "also with -q" in sub.choices["adapt"].description


def _usage_error(capsys, *argv) -> str:
    """A usage error (argparse's exit, status 2): its first line; nothing on stdout."""
    from svgen.cli import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert e.value.code == 2 and out == "" and "Traceback" not in err
    return err.splitlines()[0]


def test_minus_k_is_top_k_and_minus_capital_k_support_vectors_each_refused_by_the_other(cli, capsys, files,
                                                                                       tmp_path):
    fit = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "--out", tmp_path / "k.svgen")
    line = _usage_error(capsys, *fit, "-k", "2")
    assert "-k is classify's --top-k" in line and "-K/--n-support" in line and not (tmp_path / "k.svgen").exists()
    line = _usage_error(capsys, "classify", files / "a.svgen", "--features", files / "X.npy", "-K", "2")
    assert "-K is fit's --n-support" in line and "-k/--top-k" in line
    code, out, _ = cli("classify", files / "a.svgen", "--features", files / "X.npy", "-k", "2")
    assert code == 0 and out.splitlines()[0] == "index,source,row,label_1,score_1,label_2,score_2,head"
    assert cli(*fit, "-K", "3")[0] == 0
    assert SVGClassifier.load(tmp_path / "k.svgen").fit_config_.n_support == 3


def test_the_artifact_may_follow_features(cli, files, tmp_path):
    art, X = files / "a.svgen", files / "X.npy"
    want = cli("classify", art, "--features", X, "-k", "2")
    assert want[0] == 0
    assert cli("classify", "--features", X, art, "-k", "2") == want
    both = cli("classify", "-k", "2", "--features", X, files / "big.npy", art)[1]
    assert both.count("\n") == 1 + 12 + 20000 and both.startswith(want[1])
    one_line_error(*cli("classify", "--features", X, tmp_path / "missing.svgen"), "missing.svgen")
    one_line_error(*cli("classify", "--features", X, art, tmp_path), "not both")
    one_line_error(*cli("classify", "--features", X), "ARTIFACT_DIR")


def test_python_dash_m_svgen_is_the_command(files):
    code, out, err = _svgen("--version")
    assert code == 0 and out.startswith("svgen ")
    code, out, err = _svgen("classify", files / "a.svgen", "--features", files / "X.npy", "-k", "1")
    assert code == 0 and len(out.splitlines()) == 13, err


def test_the_documented_class_log_factor_rule_reproduces_svgen(cli, tmp_path):
    """docs/usage.md: an exported mixture's probabilities are w·p_kernel + (1 − w)·p_linear, times
    exp(class_log_factor), renormalised; on a fit that tilts its classes without shots that is svgen's own."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(1)   # shots for 4 of 8 classes, shifted toward the others: the fit tilts them
    P = rng.normal(size=(8, D)).astype(np.float32)
    P /= np.linalg.norm(P, axis=1, keepdims=True)
    y = np.repeat(np.arange(4), 6)
    X = (P[y] + 0.6 * rng.normal(size=(len(y), D)) / np.sqrt(D) + 0.5 * P[(y + 4) % 8]).astype(np.float32)
    clf = SVGClassifier(n_support=2).fit(P).adapt(X, y)
    assert clf.default_head_ == "mixture" and clf.heads_.calibration.shotless_offset > 0
    clf.save(tmp_path / "m.svgen")
    assert cli("export", tmp_path / "m.svgen", "--head", "mixture", "--out", tmp_path / "m.safetensors")[0] == 0
    t = load_file(str(tmp_path / "m.safetensors"))
    docs = (ROOT / "docs" / "usage.md").read_text()
    assert all(k.split(".")[0] in ("kernel", "linear", "mixture_weight", "class_log_factor", "temperature")
               for k in t)
    assert "`class_log_factor`" in docs and "exp(class_log_factor)" in docs and "renormalise" in docs
    np.testing.assert_array_equal(t["class_log_factor"] > 0, np.arange(8) >= 4)   # δ for the classes without shots
    import torch

    q = torch.from_numpy(rng.normal(size=(20, D)).astype(np.float32))
    w = float(t["mixture_weight"])
    p = (w * clf.predict_proba(q, head="kernel").double().numpy()
         + (1 - w) * clf.predict_proba(q, head="linear").double().numpy())
    p = p * np.exp(t["class_log_factor"].astype(np.float64))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(p, clf.predict_proba(q, head="mixture").double().numpy(), atol=1e-5)
