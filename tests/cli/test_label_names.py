"""The CLI takes class-name labels, as the API does (issue 40, item 16): ``--shot-labels`` (fit, adapt) and ``eval
--labels`` read a .npy of class names (a str array) as well as of integer indices. An unknown name is one line naming
it; an object-dtype .npy (which only pickle reads) is one line too, never unpickled."""

from __future__ import annotations

import json

import numpy as np
import pytest

from svgen import SVGClassifier

from conftest import one_line_error, write_inputs

C, D = 5, 12


@pytest.fixture
def files(tmp_path):
    rng = np.random.default_rng(0)
    P = rng.normal(size=(C, D)).astype(np.float32)
    y = np.r_[np.arange(C), np.arange(C), [0, 2]]
    X = (P[y] + 0.5 * rng.normal(size=(len(y), D))).astype(np.float32)
    names = np.asarray([f"c{i}" for i in y])          # write_inputs names the classes c0 … c4
    bad = names.astype("<U8")
    bad[3] = "zebra"
    write_inputs(tmp_path, P, X=X, y=y, names=names, bad=bad)
    np.save(tmp_path / "objects.npy", names.astype(object), allow_pickle=True)
    return tmp_path


def _fit(cli, files, *extra, out="a.svgen"):
    code, _, err = cli("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
                       *extra, "--out", files / out)
    assert code == 0, err
    return files / out


def _same_heads(a, b, X):
    a, b = SVGClassifier.load(a), SVGClassifier.load(b)
    for head in ("kernel", "linear"):
        np.testing.assert_array_equal(a.decision_function(X, head), b.decision_function(X, head))


def test_adapt_and_fit_take_shot_labels_as_class_names(cli, files):
    zs = _fit(cli, files)
    X = np.load(files / "X.npy")
    for labels in ("y", "names"):
        code, _, err = cli("adapt", zs, "--shot-features", files / "X.npy", "--shot-labels", files / f"{labels}.npy",
                           "--out", files / f"adapt-{labels}.svgen")
        assert code == 0, err
    _same_heads(files / "adapt-y.svgen", files / "adapt-names.svgen", X)
    by_index = _fit(cli, files, "--shot-features", files / "X.npy", "--shot-labels", files / "y.npy", out="fy.svgen")
    by_name = _fit(cli, files, "--shot-features", files / "X.npy", "--shot-labels", files / "names.npy", out="fn.svgen")
    _same_heads(by_index, by_name, X)
    assert SVGClassifier.load(by_name).fewshot_["shots"] == len(X)


def test_eval_takes_labels_as_class_names(cli, files):
    art = _fit(cli, files)
    by_index = cli("eval", art, "--features", files / "X.npy", "--labels", files / "y.npy", "--json")
    by_name = cli("eval", art, "--features", files / "X.npy", "--labels", files / "names.npy", "--json")
    assert by_index[0] == by_name[0] == 0, by_name[2]
    assert json.loads(by_name[1]) == json.loads(by_index[1])


@pytest.mark.parametrize("command", ["adapt", "fit", "eval"])
def test_an_unknown_name_or_an_object_array_is_one_line_and_nothing_is_written(cli, files, command):
    art = _fit(cli, files)
    owner = "the classes file" if command == "fit" else "the artifact"
    for labels, words in (("bad", ("zebra", f"not classes of {owner}", "5 classes", "'c0'")),
                          ("objects", ("objects.npy", "pickle", "dtype=str"))):
        out = files / "new.svgen"
        if command == "eval":
            argv = ("eval", art, "--features", files / "X.npy", "--labels", files / f"{labels}.npy")
        elif command == "adapt":
            argv = ("adapt", art, "--shot-features", files / "X.npy", "--shot-labels", files / f"{labels}.npy",
                    "--out", out)
        else:
            argv = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
                    "--shot-features", files / "X.npy", "--shot-labels", files / f"{labels}.npy", "--out", out)
        line = one_line_error(*cli(*argv), *words)
        assert ("--labels" if command == "eval" else "--shot-labels") in line or labels == "objects"
        assert not out.exists() and not [p for p in files.iterdir() if p.name.startswith(".new.svgen")]
