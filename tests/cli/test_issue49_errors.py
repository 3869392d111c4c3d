"""Issue 49, items 10–12, 17 and 18: one line instead of ``internal error``, and small usability fixes.

* 10: a tampered ``fewshot.heads_vs_zero_shot`` record (read by ``diagnose`` and ``eval``) is refused where the
  artifact is read, in one line naming the field, instead of a KeyError/AttributeError/ValueError deep inside.
* 11: a ``.npy`` header cut off inside its dictionary (NumPy's tokenizer fails) is one line.
"""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest

from conftest import one_line_error


# ----------------------------------------------------------------------------- item 10: fewshot.heads_vs_zero_shot

@pytest.fixture(scope="module")
def adapted(tmp_path_factory):
    """A real adapted artifact, written by ``svgen fit`` and ``svgen adapt`` (5 classes, 4 shots each)."""
    from svgen.cli import main

    root = tmp_path_factory.mktemp("adapted")
    rng = np.random.default_rng(1)
    C, D = 5, 16
    P = rng.normal(size=(C, D)).astype(np.float32)
    y = np.repeat(np.arange(C), 4)
    X = (P[y] / np.linalg.norm(P[y], axis=1, keepdims=True) + 0.5 * rng.normal(size=(len(y), D))).astype(np.float32)
    np.save(root / "P.npy", P)
    np.save(root / "X.npy", X)
    np.save(root / "y.npy", y)
    (root / "classes.txt").write_text("".join(f"c{i}\n" for i in range(C)))
    assert main(["-q", "fit", "--prototypes", str(root / "P.npy"), "--classes", str(root / "classes.txt"), "-K", "2",
                 "--steps", "5", "--out", str(root / "zs.svgen")]) == 0
    assert main(["-q", "adapt", str(root / "zs.svgen"), "--shot-features", str(root / "X.npy"), "--shot-labels",
                 str(root / "y.npy"), "--out", str(root / "ad.svgen")]) == 0
    meta = json.loads((root / "ad.svgen" / "svgen.json").read_text())
    assert {"cosine", "kernel", "linear"} <= set(meta["fewshot"]["heads_vs_zero_shot"]["heads"])
    return root


def _set(path, value):
    """Set ``fewshot.heads_vs_zero_shot.<path>`` (``()``: the record itself) to ``value``."""
    def change(fewshot):
        *parents, last = ("heads_vs_zero_shot", *path)
        for k in parents:
            fewshot = fewshot[k]
        fewshot[last] = value
    return change


def _drop(*path):
    def change(fewshot):
        *parents, last = ("heads_vs_zero_shot", *path)
        for k in parents:
            fewshot = fewshot[k]
        del fewshot[last]
    return change


# (tampering of the record, words the one line must hold: the field it names)
TAMPERED = {
    "record a string": (_set((), "x"), "'fewshot.heads_vs_zero_shot' must be a JSON object"),
    "record a list": (_set((), [1]), "'fewshot.heads_vs_zero_shot' must be a JSON object"),
    "no heads": (_drop("heads"), "'fewshot.heads_vs_zero_shot' lacks 'heads'"),
    "no cosine head": (_drop("heads", "cosine"), "'fewshot.heads_vs_zero_shot.heads' lacks 'cosine'"),
    "no metric": (_drop("heads", "kernel", "nll"), "'fewshot.heads_vs_zero_shot.heads.kernel' lacks 'nll'"),
    "heads a list": (_set(("heads",), [1, 2]), "'fewshot.heads_vs_zero_shot.heads' must be a JSON object"),
    "a head's metrics a list (wrong shape)": (_set(("heads", "kernel"), [1, 2, 3]),
                                              "'fewshot.heads_vs_zero_shot.heads.kernel' must be a JSON object"),
    "NaN as a string": (_set(("heads", "kernel", "nll"), "NaN"), "'fewshot.heads_vs_zero_shot.heads.kernel.nll'"),
    "null metric": (_set(("heads", "kernel", "acc1"), None), "'fewshot.heads_vs_zero_shot.heads.kernel.acc1'"),
    "accuracy above 1": (_set(("heads", "linear", "acc5"), 7.0), "'fewshot.heads_vs_zero_shot.heads.linear.acc5'"),
    "images a string": (_set(("images",), "x"), "'fewshot.heads_vs_zero_shot.images'"),
    "worse a list": (_set(("worse_than_zero_shot",), ["kernel"]),
                     "'fewshot.heads_vs_zero_shot.worse_than_zero_shot' must be a JSON object"),
    "worse metrics a string": (_set(("worse_than_zero_shot",), {"kernel": "acc1"}),
                               "'fewshot.heads_vs_zero_shot.worse_than_zero_shot.kernel'"),
    "unknown head": (_set(("worse_than_zero_shot",), {"bogus": ["acc1"]}), "names 'bogus', which is not a head"),
    "unknown head in heads": (_set(("heads", "bogus"), {"acc1": 0.5, "acc5": 1.0, "nll": 1.0}),
                              "'fewshot.heads_vs_zero_shot.heads' names 'bogus'"),
    "worse head not scored": (lambda fs: (_drop("heads", "linear")(fs),
                                          _set(("worse_than_zero_shot",), {"linear": ["acc1"]})(fs)),
                              "names 'linear', which 'fewshot.heads_vs_zero_shot.heads' does not compare"),
    "unknown metric": (_set(("worse_than_zero_shot",), {"kernel": ["acc9"]}),
                       "'fewshot.heads_vs_zero_shot.worse_than_zero_shot.kernel[0]' must be one of"),
    "versus a number": (_set(("versus_zero_shot", "kernel", "acc1"), 3),
                        "'fewshot.heads_vs_zero_shot.versus_zero_shot.kernel.acc1' must be a JSON object"),
}


def _tampered(adapted, tmp_path, change):
    art = tmp_path / "t.svgen"
    shutil.copytree(adapted / "ad.svgen", art)
    meta = json.loads((art / "svgen.json").read_text())
    change(meta["fewshot"])
    (art / "svgen.json").write_text(json.dumps(meta))
    return art


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_tampered_heads_record_is_one_line_naming_the_field(adapted, tmp_path, cli, case):
    change, words = TAMPERED[case]
    art = _tampered(adapted, tmp_path, change)
    for argv in (("diagnose", art), ("eval", art, "--features", adapted / "X.npy", "--labels", adapted / "y.npy")):
        line = one_line_error(*cli(*argv), words)
        assert "internal error" not in line and "svgen.json" in line, line


def test_an_intact_heads_record_is_still_reported(adapted, tmp_path, cli):
    """The check refuses only what svgen could not have written: a head called worse than zero-shot is reported."""
    art = _tampered(adapted, tmp_path, _set(("worse_than_zero_shot",), {"kernel": ["acc1", "nll"]}))
    code, out, err = cli("diagnose", art)
    assert code == 0, err
    assert "the kernel head is worse than zero-shot (the cosine head)" in out
    code, out, err = cli("eval", adapted / "ad.svgen", "--features", adapted / "X.npy", "--labels",
                         adapted / "y.npy")
    assert code == 0 and "error" not in err, err


# ----------------------------------------------------------------------------- item 11: a .npy header cut off


def _cut_header(path, keep):
    """``path`` rewritten with its header dictionary cut after ``keep`` characters (the length field consistent)."""
    data = path.read_bytes()
    header = data[10:10 + keep] + b"\n"
    path.write_bytes(data[:8] + struct.pack("<H", len(header)) + header)


@pytest.mark.parametrize("keep", [1, 9, 30, 52, 58])
def test_a_npy_header_cut_inside_its_dict_is_one_line(adapted, tmp_path, cli, keep):
    from svgen.errors import SvgenError
    from svgen.npy import load_npy

    bad = tmp_path / "cut.npy"
    np.save(bad, np.zeros((3, 16), np.float32))
    _cut_header(bad, keep)
    with pytest.raises(SvgenError, match="damaged .npy header"):
        load_npy(bad, "features")
    line = one_line_error(*cli("classify", adapted / "ad.svgen", "--features", bad), "cut.npy",
                          "damaged .npy header", "cut off")
    assert "internal error" not in line
