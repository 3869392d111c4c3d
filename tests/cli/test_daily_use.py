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
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.errors import SvgenError

from conftest import one_line_error as _one_line_error, strict_json

ROOT = Path(__file__).resolve().parents[2]
D = 16


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
    assert clf.classes_.tolist() == names


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


# ----------------------------------------------------------------------------- 3 + 4. formats and one schema

NAMES = ["cat", "dog", "bird", "fish", "horse", "cow"]


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    root = tmp_path_factory.mktemp("art")
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(len(NAMES), 2, D)).astype(np.float32)
    np.save(root / "protos.npy", protos)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    SVGClassifier(n_support=2).fit(protos, classes=NAMES).save(root / "a.svgen")
    x = rng.normal(size=(12, D)).astype(np.float32)
    np.save(root / "feats.npy", x)
    np.save(root / "feats2.npy", x[:5])
    np.save(root / "labels.npy", rng.integers(0, len(NAMES), size=12))
    return root


def _scores(art, head="kernel", probs=False):
    clf = SVGClassifier.load(art / "a.svgen")
    x = torch.from_numpy(np.load(art / "feats.npy"))
    return (clf.predict_proba if probs else clf.decision_function)(x, head=head)


@pytest.mark.parametrize("suffix,fmt", [(".csv", "csv"), (".jsonl", "jsonl"), (".ndjson", "jsonl"),
                                        (".parquet", "parquet")])
def test_classify_out_suffix_decides_the_format(cli, art, tmp_path, suffix, fmt):
    out = tmp_path / f"p{suffix}"
    code, stdout, err = cli("classify", art / "a.svgen", "--features", art / "feats.npy", "--out", out)
    assert code == 0 and stdout == "", err
    assert f"{fmt}" in err.splitlines()[-1] and "scores" in err.splitlines()[-1]
    data = out.read_bytes()
    if fmt == "parquet":
        assert data[:4] == b"PAR1"
    elif fmt == "jsonl":
        assert [strict_json(l)["index"] for l in data.decode().splitlines()] == list(range(12))
    else:
        assert data.decode().startswith("index,source,row,label_1,score_1")


@pytest.mark.parametrize("fmt,suffix", [("csv", ".jsonl"), ("jsonl", ".parquet"), ("parquet", ".csv")])
def test_classify_format_contradicting_the_suffix_is_refused(cli, art, tmp_path, fmt, suffix):
    out = tmp_path / f"p{suffix}"
    _one_line_error(*cli("classify", art / "a.svgen", "--features", art / "feats.npy", "--format", fmt,
                         "--out", out), f"--format {fmt}", "contradicts")
    assert not out.exists()


def test_parquet_needs_a_file_and_pyarrow(cli, art, tmp_path, monkeypatch):
    _one_line_error(*cli("classify", art / "a.svgen", "--features", art / "feats.npy", "--format", "parquet"),
                    "--out")
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    _one_line_error(*cli("classify", art / "a.svgen", "--features", art / "feats.npy", "--out",
                         tmp_path / "p.parquet"), "pyarrow", "pip install")
    assert not (tmp_path / "p.parquet").exists()


def test_eval_out_suffix_decides_the_format(cli, art, tmp_path):
    args = ("eval", art / "a.svgen", "--features", art / "feats.npy", "--labels", art / "labels.npy")
    code, _, err = cli(*args, "--out", tmp_path / "e.json")
    assert code == 0, err
    assert set(strict_json((tmp_path / "e.json").read_text())) >= {"cosine", "kernel", "linear"}
    assert "JSON" in err
    code, _, err = cli(*args, "--out", tmp_path / "e.txt")
    assert code == 0 and (tmp_path / "e.txt").read_text().startswith("head ")
    _one_line_error(*cli(*args, "--json", "--out", tmp_path / "f.txt"), "--json", "contradicts")
    assert not (tmp_path / "f.txt").exists()


def test_local_parquet_has_the_ray_engines_columns_and_exact_float32(cli, art, tmp_path):
    import pyarrow.parquet as pq

    from svgen.engine.predictions import feature_keys, prediction_table

    for probs in (False, True):
        out = tmp_path / f"p{probs}.parquet"
        extra = ("--probs",) if probs else ()
        code, _, err = cli("classify", art / "a.svgen", "--features", art / "feats.npy", "-k", 3, *extra,
                           "--out", out)
        assert code == 0, err
        assert ("probabilities" if probs else "scores") in err
        local = pq.read_table(out)
        block = SimpleNamespace(spec={"file": str(art / "feats.npy"), "start": 0, "stop": 12, "id0": 0})
        ray = prediction_table(feature_keys(block), _scores(art, probs=probs), NAMES, 3, "kernel", probs)
        assert local.schema.equals(ray.schema), (local.schema, ray.schema)
        assert local.to_pylist() == ray.to_pylist()  # same rows, same float32 values, exactly


def test_csv_and_jsonl_carry_the_same_schema_in_full_float32(cli, art):
    s = _scores(art).numpy()
    top = np.sort(s, axis=1)[:, ::-1][:, :2]
    code, text, err = cli("classify", art / "a.svgen", "--features", art / "feats.npy", art / "feats2.npy", "-k", 2)
    assert code == 0, err
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == ["index", "source", "row", "label_1", "score_1", "label_2", "score_2", "head"]
    assert len(rows) == 17 and rows[12]["index"] == "12" and rows[12]["row"] == "0"
    assert rows[12]["source"].endswith("feats2.npy") and rows[0]["head"] == "kernel"
    got = np.array([[np.float32(r["score_1"]), np.float32(r["score_2"])] for r in rows[:12]])
    np.testing.assert_array_equal(got, top)  # every bit of the float32, not 6 significant digits
    code, text, _ = cli("classify", art / "a.svgen", "--features", art / "feats.npy", "-k", 2, "--probs",
                        "--format", "jsonl")
    first = strict_json(text.splitlines()[0])
    assert list(first) == ["index", "source", "row", "labels", "probs", "head"]


def test_classify_features_before_the_artifact_is_not_swallowed(cli, art):
    code, text, err = cli("classify", "--features", art / "feats.npy", art / "a.svgen", "--top-k", 1)
    assert code == 0, err
    assert len(text.splitlines()) == 13
    _one_line_error(*cli("classify", "--features", art / "feats.npy"), "ARTIFACT_DIR")


# ----------------------------------------------------------------------------- issue 24: 3, 8, 10

def test_csv_quotes_carriage_returns_so_python_reads_back_n_rows():
    from svgen.io.output import write_text_rows

    names = [f"img{i}.jpg" for i in range(14)]
    names[3], names[7] = "bad\rname.jpg", "two\nlines.jpg"
    buf = io.StringIO(newline="")
    write_text_rows(buf, [({"path": names}, torch.randn(14, 4))], ["a", "b", "c", "d"], 2, "csv", "kernel", False)
    rows = list(csv.reader(io.StringIO(buf.getvalue(), newline="")))
    assert len(rows) == 15 and [r[0] for r in rows[1:]] == names


def test_jsonl_is_strict_json_and_probabilities_are_never_nan(caplog):
    from svgen.io.output import write_text_rows

    s = torch.tensor([[1.0, float("inf"), 0.5], [float("nan"), 2.0, 1.0], [-float("inf"), 0.0, 3.0]])
    buf = io.StringIO()
    with caplog.at_level(logging.WARNING, logger="svgen"):
        write_text_rows(buf, [({"index": [0, 1, 2]}, s)], ["a", "b", "c"], 3, "jsonl", "kernel", False)
    rows = [strict_json(l) for l in buf.getvalue().splitlines()]
    assert rows[0]["scores"] == [None, 1.0, 0.5]
    assert rows[1]["labels"][-1] == "a" and rows[1]["scores"][-1] is None  # NaN ranks last, written as null
    assert any("not finite" in r.getMessage() for r in caplog.records)
    with pytest.raises(SvgenError, match="non-finite probabilities"):
        write_text_rows(io.StringIO(), [({"index": [0, 1, 2]}, s.softmax(1))], ["a", "b", "c"], 2, "jsonl",
                        "kernel", True)


def test_cli_jsonl_of_overflowing_scores_is_strict(cli, art, tmp_path):
    """Vote weights that overflow the scores are refused at load (one line, exit 2), and the writer itself
    writes a non-finite score as null and refuses non-finite probabilities, so JSON Lines stays strict."""
    from safetensors.torch import load_file, save_file

    from svgen.io.output import write_text_rows

    bad = tmp_path / "huge.svgen"
    import shutil

    shutil.copytree(art / "a.svgen", bad)
    t = load_file(str(bad / "weights.safetensors"))
    t["vote_weights"] = t["vote_weights"] * 3e38
    save_file(t, str(bad / "weights.safetensors"))
    code, text, err = cli("classify", bad, "--features", art / "feats.npy", "--format", "jsonl")
    assert code == 2 and text == "" and "overflow" in err and len(err.strip().splitlines()) == 1
    scores = np.array([[np.inf, 1.0, np.nan]], dtype=np.float32)
    buf = io.StringIO()
    write_text_rows(buf, iter([({"index": [0]}, scores)]), ["a", "b", "c"], 3, "jsonl", "kernel", False)
    for line in buf.getvalue().splitlines():
        strict_json(line)
    with pytest.raises(SvgenError, match="non-finite probabilities"):
        write_text_rows(io.StringIO(), iter([({"index": [0]}, scores)]), ["a", "b", "c"], 3, "jsonl", "kernel", True)


def test_the_writer_streams_blocks_as_they_come():
    """Rows are written block by block: the writer asks for block i+1 only after block i is out, so at
    most one block of scores is alive whatever N is (no timing; the generator records the stream)."""
    from svgen.io.output import write_text_rows

    buf = io.StringIO()
    seen = []

    def blocks():
        for b in range(5):
            seen.append(len(buf.getvalue()))
            yield {"index": list(range(b * 100, b * 100 + 100))}, torch.randn(100, 7)

    write_text_rows(buf, blocks(), list("abcdefg"), 3, "csv", "kernel", False)
    assert all(later > earlier for earlier, later in zip(seen, seen[1:]))  # each block written before the next
    assert len(buf.getvalue().splitlines()) == 501


def test_classify_memory_does_not_grow_with_the_input(cli, art, tmp_path, monkeypatch):
    """tracemalloc peak of a local classify to a file, in blocks of 1,000 rows: 18,000 rows take what
    3,000 take (a block or two is alive at a time), a fraction of the file (the old writer kept the N×C
    scores and all of the text). A warm-up run first, so imports are not counted."""
    import tracemalloc

    import svgen.io.output

    monkeypatch.setattr(svgen.io.output, "BLOCK_ROWS", 1000)
    rng = np.random.default_rng(3)
    peaks, sizes = {}, {}
    for n in (100, 3_000, 18_000):
        np.save(tmp_path / f"x{n}.npy", rng.normal(size=(n, D)).astype(np.float32))
        out = tmp_path / f"p{n}.csv"
        tracemalloc.start()
        try:
            code, _, err = cli("classify", art / "a.svgen", "--features", tmp_path / f"x{n}.npy", "--head", "linear",
                               "-k", 3, "--out", out)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert code == 0, err
        sizes[n] = out.stat().st_size
    assert sizes[18_000] > 5 * sizes[3_000]
    assert peaks[18_000] < 1.2 * peaks[3_000], peaks
    assert peaks[18_000] < sizes[18_000] / 2, (peaks, sizes)


# ----------------------------------------------------------------------------- 9. OpenAI's templates

def test_openai_template_sets_are_open_clips_and_help_lists_every_set_with_its_size(capsys):
    from open_clip.zero_shot_metadata import OPENAI_IMAGENET_TEMPLATES, SIMPLE_IMAGENET_TEMPLATES

    from svgen.cli import main
    from svgen.encoders.prompts import builtin_templates, load_templates

    assert load_templates("openai") == [t("{}") for t in OPENAI_IMAGENET_TEMPLATES]
    assert load_templates("openai-simple") == [t("{}") for t in SIMPLE_IMAGENET_TEMPLATES]
    assert len(load_templates("openai")) == 80 and len(load_templates("openai-simple")) == 7
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in builtin_templates():
        assert f"{name} ({len(load_templates(name))})" in text, name
    readme = " ".join((ROOT / "README.md").read_text().split())
    for name in builtin_templates():
        assert f"`{name}` ({len(load_templates(name))})" in readme, name


# ----------------------------------------------------------------------------- 12. the quick subset

def test_markers_are_assigned_by_file_and_fixture_and_registered(request):
    tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11

    import conftest

    class Item:
        def __init__(self, path, fixtures):
            self.fspath, self.fixturenames, self.marks = path, fixtures, []

        def add_marker(self, mark):
            self.marks.append(mark.name)

    items = [Item(ROOT / "tests" / "test_math.py", ["tmp_path"]),
             Item(ROOT / "tests" / "test_fit.py", ["lvis_subset", "shared_data"]),
             Item(ROOT / "tests" / "test_ray_engine.py", ["cli"])]
    conftest.pytest_collection_modifyitems(request.config, items)
    assert [i.marks for i in items] == [[], ["real_data", "slow"], ["slow"]]
    registered = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in registered} == {"slow", "real_data"}
    assert request.node.get_closest_marker("slow") is None  # this file is in the quick subset
    assert 'python -m pytest -q -m "not slow"' in (ROOT / "README.md").read_text()  # the quick command, named
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -m pytest -q" in ci and "not slow" not in ci  # CI runs everything


# ----------------------------------------------------------------------------- 2 + 5. usage errors

@pytest.mark.parametrize("argv, what", [
    (["fit", "--classes", "c.txt"], "--out"),
    (["classify", "a.svgen", "--head", "nope"], "--head"),
    (["eval", "a.svgen", "--no-such-option"], "--no-such-option"),
    (["export"], "required"),
])
def test_usage_errors_are_one_line_and_a_pointer_to_help(capsys, argv, what):
    from svgen.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"svgen {argv[0]}: error:") and what in lines[0]
    assert lines[1] == f"see 'svgen {argv[0]} --help'"


# ----------------------------------------------------------------------------- 10. a fast default fit

def test_a_fit_without_steps_builds_no_optimiser_and_wall_time_covers_the_whole_fit(monkeypatch):
    import time

    import svgen.classifier as classifier

    def no_adam(*a, **k):
        raise AssertionError("an optimiser was built for steps=0")

    monkeypatch.setattr(torch.optim, "Adam", no_adam)
    marks = {}
    from svgen.heads import predictor

    check, temps = classifier.check_embeddings, predictor.text_calibration

    def first_check(*a, **k):
        marks.setdefault("start", time.perf_counter())
        return check(*a, **k)

    def last_step(*a, **k):   # the temperatures are the fit's last step
        out = temps(*a, **k)
        marks["end"] = time.perf_counter()
        return out

    monkeypatch.setattr(classifier, "check_embeddings", first_check)
    monkeypatch.setattr(predictor, "text_calibration", last_step)
    emb, _ = _openai_style()
    clf = SVGClassifier(n_support=2).fit(emb[:5] + 0.1, classes=list("abcde"))
    m = clf.fit_metrics_
    assert m["wall_time_s"] >= marks["end"] - marks["start"]  # ordering, not a timing
    assert m["alignment_start"] == m["alignment_end"]  # steps=0: the same support vectors, measured once
    with pytest.raises(AssertionError, match="optimiser"):
        SVGClassifier(n_support=2, steps=1).fit(emb[:5] + 0.1, classes=list("abcde"))


def test_the_fits_condition_number_is_exact_when_small_and_a_labelled_bound_when_large():
    from svgen.core.scale import condition_estimate

    rng = np.random.default_rng(0)
    small = SVGClassifier(n_support=2).fit(rng.normal(size=(20, D)), classes=[f"c{i}" for i in range(20)])
    m = small.fit_metrics_
    assert m["condition_number_method"] == "eigvalsh" and m["condition_number_classes"] == 20
    exact = condition_estimate(small.support_vectors_.double(), small.bandwidth_, "rbf")["value"]
    assert m["condition_number"] == pytest.approx(exact, rel=1e-3)
    big = SVGClassifier(n_support=4).fit(rng.normal(size=(300, D)), classes=[f"c{i}" for i in range(300)])
    m = big.fit_metrics_
    assert m["condition_number_classes"] == 256 and "lower bound" in m["condition_number_method"]


# ----------------------------------------------------------------------------- 6. the scikit-learn reflex

def _shots(n_per=4, C=6, seed=0):
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(C, D)).astype(np.float32)
    y = np.repeat(np.arange(C), n_per)
    X = (protos[y] + 0.3 * rng.normal(size=(len(y), D))).astype(np.float32)
    return protos, X, y


@pytest.mark.parametrize("as_names", [False, True])
def test_fit_on_images_and_labels_points_to_shots_and_adapt(as_names):
    protos, X, y = _shots()
    labels = np.asarray(NAMES)[y] if as_names else y
    with pytest.raises(SvgenError) as e:
        SVGClassifier().fit(X, labels)
    msg = str(e.value)
    assert "shots=(X, y)" in msg and "adapt(X, y)" in msg and "SVGClassifier(prototypes=P, classes=names)" in msg
    assert "\n" not in msg


def test_adapt_and_shots_take_class_names_as_score_does():
    protos, X, y = _shots()
    names = np.asarray(NAMES)[y]
    by_index = SVGClassifier(n_support=2).fit(protos, classes=NAMES).adapt(X, y)
    by_name = SVGClassifier(n_support=2).fit(protos, classes=NAMES).adapt(X, list(names))
    torch.testing.assert_close(by_name.decision_function(X), by_index.decision_function(X))
    via_fit = SVGClassifier(n_support=2).fit(protos, classes=NAMES, shots=(X, names))
    torch.testing.assert_close(via_fit.decision_function(X), by_index.decision_function(X))
    assert by_name.score(X, names) == by_index.score(X, y)
    with pytest.raises(SvgenError, match="'zebra'"):
        SVGClassifier(n_support=2).fit(protos, classes=NAMES).adapt(X, ["zebra"] + list(names[1:]))


def test_transductive_labels_are_a_numpy_array():
    protos, X, _ = _shots(n_per=6)
    clf = SVGClassifier(n_support=2).fit(protos, classes=NAMES).adapt(unlabelled=X)
    assert isinstance(clf.transductive_labels_, np.ndarray) and clf.transductive_labels_.shape == (36, 6)
    np.testing.assert_allclose(clf.transductive_labels_.sum(1), 1, rtol=1e-5)


# ----------------------------------------------------------------------------- 8. no unused device

def test_the_estimator_has_no_device_setting_that_nothing_uses():
    with pytest.raises(TypeError, match="device"):
        SVGClassifier(device="cuda")
    with pytest.raises(SvgenError, match="'device'"):
        SVGClassifier().set_params(device="cuda")
    assert "device" not in SVGClassifier().get_params()


# ----------------------------------------------------------------------------- 7. diagnose on adapted artifacts

def test_diagnose_describes_the_deployed_kernel_of_an_adapted_artifact(cli, tmp_path):
    protos, X, y = _shots()
    clf = SVGClassifier(n_support=2).fit(protos, classes=NAMES).adapt(X, y)
    clf.save(tmp_path / "a.svgen")
    code, text, err = cli("diagnose", tmp_path / "a.svgen")
    assert code == 0, err
    line = next(l for l in text.splitlines() if l.startswith("deployed kernel"))
    assert "24 support rows (image 24)" in line   # the adapted kernel head's rows are the shots (svgen.adapt.residual)
    assert f"σ={float(clf.bandwidth_):.4g}" in line and f"σ={clf.zero_shot_.kernel.bandwidth:.4g}" in line
    chose = text.splitlines()[text.splitlines().index(line) + 1]
    assert "24 shot(s) in 6 class(es)" in chose and f"σ={clf.fewshot_['kernel']['sigma']:.4g}" in chose
    assert f"default head: {clf.default_head_}" in chose
    code, text, _ = cli("diagnose", tmp_path / "a.svgen", "--json")
    d = strict_json(text)["deployed"]
    assert d["rows_by_source"] == {"image": 24} and d["sigma"] == pytest.approx(float(clf.bandwidth_))
    SVGClassifier(n_support=2).fit(protos, classes=NAMES).save(tmp_path / "z.svgen")
    code, text, _ = cli("diagnose", tmp_path / "z.svgen")
    assert "deployed kernel" not in text and "described below" not in text  # zero-shot: the text kernel is deployed
    assert strict_json(cli("diagnose", tmp_path / "z.svgen", "--json")[1])["deployed"] is None


# ----------------------------------------------------------------------------- 13. small items

@pytest.mark.parametrize("command", ["adapt", "check-encoder", "classify", "eval", "export"])
def test_help_descriptions_are_wrapped_and_examples_kept(capsys, monkeypatch, command):
    from svgen.cli import main

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    before_examples = text.split("examples:")[0]
    assert max(len(line) for line in before_examples.splitlines()) <= 100
    assert "examples:\n  svgen " + command in text  # one example command per line, as written


# ----------------------------------------------------------------------------- 11. the README is a manual

def test_readme_is_a_short_manual_that_starts_with_install_and_test():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 300
    block = text.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()
    assert len(block) == 2
    install, test = block
    assert "svgen fit --classes cifar10" in install and test == ".venv/bin/python -m pytest -q"
    # CPU-only torch comes before anything that could pull CUDA wheels
    first_pip = install.split("&&")[1].strip()
    assert "torch" in first_pip and "download.pytorch.org/whl/cpu" in first_pip
    assert install.index("whl/cpu") < install.index("pip install -e")
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q -e ".[dev,onnx,ray]"' in ci and 'pip install -e ".[dev,onnx,ray]"' in install
    assert "torch==2.14.1 torchvision==0.29.1" in ci
    for section in ("## What it is", "## Install", "## Quickstart", "## The tiny test model", "## Concepts",
                    "## Python API", "## Results"):
        assert section in text, section
    for link in ("docs/usage.md", "docs/accuracy.md", "docs/fewshot.md", "docs/performance.md"):
        assert f"]({link}" in text and (ROOT / link).is_file(), link


def test_the_tiny_model_script_writes_the_tests_model(tmp_path, capsys):
    import runpy

    main = runpy.run_path(str(ROOT / "scripts" / "make_tiny_model.py"))["main"]
    assert main([str(tmp_path / "tiny")]) == 0
    assert "wrote" in capsys.readouterr().out
    from conftest import build_tiny_model

    again = build_tiny_model(tmp_path / "again")
    assert (tmp_path / "tiny" / "tiny.safetensors").read_bytes() == Path(again["safetensors"]).read_bytes()
    assert (tmp_path / "tiny" / "local" / "open_clip_config.json").is_file()


def test_classes_can_be_added_to_a_vocabulary_that_repeats_names(cli, vocab_files):
    emb, names = _openai_style()
    clf = SVGClassifier(n_support=2).fit(emb, classes=names)
    new = np.random.default_rng(9).normal(size=(1, 3, D)).astype(np.float32)
    clf.add_classes(new, ["zebra"])
    assert clf.classes_.tolist() == names + ["zebra"]
    with pytest.raises(SvgenError, match="already in the artifact"):
        clf.add_classes(new * 2, ["missile"])
    with pytest.raises(SvgenError, match="'zebra' and 'okapi'"):  # a new prototype equal to an old one
        clf.add_classes(new, ["okapi"])
