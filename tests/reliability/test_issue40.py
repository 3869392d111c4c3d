"""Regression tests for issue 40, items 8 to 12: each reproduces one attack of the red-team pass (docs/reliability.md).

An output that would destroy an input, tracebacks that must be one line, a NaN row in the Ray engine, tar members
that vanished, and inputs that one command took and another refused.
"""

from __future__ import annotations

import io
import json
import os
import tarfile

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from svgen import SVGClassifier
from svgen.errors import SvgenError

from conftest import file_tree as tree, one_line, small_input_fixtures

C, D = 5, 16
NAMES = [f"class {i}" for i in range(C)]


files, work = small_input_fixtures(NAMES, D, "i40")   # the inputs, and a private copy the test runs in


def _npy_with_shape(path, shape, descr="<f4", data=b"\0" * 1024):
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": descr, "fortran_order": False, "shape": shape})
        f.write(data)


# ----------------------------------------------------------------------------- 8. no output destroys an input

WRITES_INTO_INPUTS = {
    "export over the artifact's weights": ("export", "a.svgen", "--head", "linear", "--out",
                                           "a.svgen/weights.safetensors", "--force"),
    "export through a link to the artifact": ("export", "link.svgen", "--out", "link.svgen/head.npz"),
    "export by a relative detour": ("export", "a.svgen", "--out", "sub/../a.svgen/head.safetensors"),
    "classify --out": ("classify", "a.svgen", "--features", "F.npy", "--out", "a.svgen/preds.csv"),
    "classify over its own features": ("classify", "a.svgen", "--features", "F.npy", "--out", "F.npy", "--force"),
    "eval --out": ("eval", "a.svgen", "--features", "F.npy", "--labels", "y.npy", "--out", "a.svgen/e.json"),
    "eval --plot": ("eval", "a.svgen", "--features", "F.npy", "--labels", "y.npy", "--plot", "a.svgen/r.png"),
    "diagnose --plot": ("diagnose", "a.svgen", "--plot", "a.svgen/svgen.json", "--force"),
    "fit into an artifact": ("fit", "--prototypes", "P.npy", "--classes", "classes.txt", "--out", "a.svgen/b.svgen"),
    "adapt over itself": ("adapt", "a.svgen", "--shot-features", "F.npy", "--shot-labels", "y.npy", "--out",
                          "a.svgen", "--force"),
    "adapt into itself": ("adapt", "a.svgen", "--shot-features", "F.npy", "--shot-labels", "y.npy", "--out",
                          "a.svgen/b.svgen"),
    "classify --engine ray": ("classify", "a.svgen", "--features", "F.npy", "--engine", "ray", "--out",
                              "a.svgen/preds"),
}


@pytest.mark.parametrize("attack", sorted(WRITES_INTO_INPUTS))
def test_an_output_inside_or_equal_to_an_input_is_refused(cli, work, attack):
    """`export A --out A/weights.safetensors --force` overwrote the artifact's own weights (then `classify A`
    failed with "lacks required tensor(s)"). Every command that writes refuses an output that is an input or lies
    inside an artifact, also through a symbolic link or `..`, in one line, and writes nothing."""
    os.symlink("a.svgen", work / "link.svgen")
    (work / "sub").mkdir()
    before = tree(work)
    code, out, err = cli(*WRITES_INTO_INPUTS[attack])
    line = one_line(code, err)
    assert ("is also an input" in line or "inside the svgen artifact" in line), line
    assert out == "" and tree(work) == before
    assert cli("classify", "a.svgen", "--features", "F.npy")[0] == 0


def test_an_output_next_to_the_artifact_is_still_written(cli, work):
    assert cli("export", "a.svgen", "--head", "linear", "--out", "a-linear.safetensors")[0] == 0
    assert cli("classify", "a.svgen", "--features", "F.npy", "--out", "preds.csv")[0] == 0
    assert (work / "a-linear.safetensors").is_file() and (work / "preds.csv").is_file()


# ----------------------------------------------------------------------------- 9. tracebacks that are one line now

def test_a_vocabulary_of_one_name_in_two_cases_fits(cli, work, caplog):
    """`Cat` and `cat ` encode alike: the neighbour-difference covariance was zero and its inverse raised
    torch's LinAlgError. As for any repeated name, the fit warns and goes on (the metric is then the cosine rule);
    --strict refuses it in one line."""
    from svgen.core.metric import shrink_to_condition

    sigma, delta = shrink_to_condition(torch.zeros(D, D, dtype=torch.float64), 1.3)
    assert delta == 1.0 and torch.equal(sigma, torch.eye(D, dtype=torch.float64))
    p = np.random.default_rng(1).normal(size=(1, D)).astype(np.float32)
    np.save(work / "same.npy", np.concatenate([p, p]))
    (work / "cats.txt").write_text("Cat\ncat \n")
    code, out, err = cli("fit", "--prototypes", "same.npy", "--classes", "cats.txt", "--out", "cats.svgen")
    assert code == 0 and "identical or near-identical prototypes" in caplog.text, err
    clf = SVGClassifier.load(work / "cats.svgen")
    assert clf.temperatures_["linear"] == 1.0   # tied logits: no temperature changes them (it was the 1e-8 floor)
    for head in ("kernel", "linear", "cosine"):
        np.testing.assert_allclose(clf.predict_proba(np.concatenate([p, -p]), head=head), 0.5, atol=1e-4)
    one_line(*cli("fit", "--prototypes", "same.npy", "--classes", "cats.txt", "--out", "c2.svgen", "--strict")[::2],
             "identical or near-identical prototypes")
    assert not (work / "c2.svgen").exists()


def test_a_huge_integer_in_svgen_json_is_one_line(cli, work):
    meta = (work / "a.svgen" / "svgen.json").read_text()
    (work / "a.svgen" / "svgen.json").write_text(meta.replace('"n_support": 2', '"n_support": ' + "7" * 5000))
    for argv in (("classify", "a.svgen", "--features", "F.npy"), ("diagnose", "a.svgen")):
        one_line(*cli(*argv)[::2], "svgen.json", "not a valid")


def test_a_negative_size_in_an_npy_header_is_one_line(cli, work):
    """A header saying shape (-1, 16) raised OverflowError in the local and Ray engines."""
    from svgen.engine.blocks import plan_blocks

    _npy_with_shape(work / "neg.npy", (-1, D))
    for argv in (("classify", "a.svgen", "--features", "neg.npy"),
                 ("adapt", "a.svgen", "--shot-features", "neg.npy", "--shot-labels", "y.npy", "--out", "b.svgen"),
                 ("eval", "a.svgen", "--features", "F.npy", "--labels", "neg.npy")):
        one_line(*cli(*argv)[::2], "neg.npy", "damaged .npy header")
    with pytest.raises(SvgenError, match="damaged .npy header"):
        plan_blocks([str(work / "neg.npy")], 4, features=True, dim=D)
    assert not (work / "b.svgen").exists()


def test_negative_workers_and_a_device_that_is_no_device_are_refused(cli, work, capsys):
    with pytest.raises(SystemExit) as e:   # a usage error: argparse's line, and where to read the help
        cli("classify", "a.svgen", "photos", "--workers", "-1")
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.splitlines()[0] == "svgen classify: error: argument --workers: must be 0 or more, " \
                                                        "got -1", err
    for argv in (("classify", "a.svgen", "--features", "F.npy", "--device", "banana"),
                 ("classify", "a.svgen", "photos/", "--device", "banana"),
                 ("fit", "--prototypes", "P.npy", "--classes", "classes.txt", "--out", "b.svgen", "--device", "gpu"),
                 ("adapt", "a.svgen", "--shot-features", "F.npy", "--shot-labels", "y.npy", "--out", "b.svgen",
                  "--device", "cuda:x")):
        one_line(*cli(*argv)[::2], "--device", "is not a device")
    assert not (work / "b.svgen").exists()
    assert cli("classify", "a.svgen", "--features", "F.npy", "--device", "auto")[0] == 0


def test_an_unexpected_exception_is_one_line_and_the_traceback_is_behind_vv(cli, work, monkeypatch):
    from svgen.commands import diagnose

    def broken(args):
        raise RuntimeError("something svgen did not foresee\nsecond line")

    monkeypatch.setattr(diagnose, "run", broken)
    line = one_line(*cli("diagnose", "a.svgen")[::2], "internal error: RuntimeError: something svgen did not foresee")
    assert "rerun with -vv" in line
    code, out, err = cli("-vv", "diagnose", "a.svgen")
    assert code == 2 and "Traceback" in err and "internal error: RuntimeError" in err.strip().splitlines()[-1]

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(diagnose, "run", interrupted)
    code, out, err = cli("diagnose", "a.svgen")
    assert code == 130 and "Traceback" not in err


# ----------------------------------------------------------------------------- 10. a NaN row in the Ray engine

def test_ray_engine_blocks_turn_nan_and_zero_rows_into_failures(work):
    """The Ray engine's actor scored a NaN row, raised, and the run ended in a 61-line RayTaskError with half an
    output folder. A feature block now scores its good rows and lists the others as failures (rows + failures =
    inputs); the single-process classify refuses such a file in one line. (End to end on Ray:
    tests/engine/test_ray_engine.py::test_nan_rows_are_failures_on_ray.)"""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from svgen.engine.blocks import plan_blocks
    from svgen.engine.ray import BlockClassifier

    x = np.load(work / "F.npy")
    x[3, 2], x[5] = np.nan, 0
    np.save(work / "bad.npy", x)
    blocks = plan_blocks([str(work / "bad.npy")], 8, features=True, dim=D)
    bc = BlockClassifier(str(work / "a.svgen"), "kernel", False, 3)
    rows = failed = 0
    reasons = {}
    for b in blocks:
        r = bc.classify(b)
        part = pq.read_table(pa.BufferReader(r["part"]))
        rows += part.num_rows
        assert 3 not in part.column("row").to_pylist() and 5 not in part.column("row").to_pylist()
        if r["failed"]:
            f = pq.read_table(pa.BufferReader(r["failed"])).to_pylist()
            failed += len(f)
            reasons.update({e["path"]: e["reason"] for e in f})
    assert rows + failed == len(x) and failed == 2
    assert "NaN or inf" in reasons[f"{work / 'bad.npy'}[3]"] and "all-zero" in reasons[f"{work / 'bad.npy'}[5]"]


# ----------------------------------------------------------------------------- 11. every tar member accounted for

def _png() -> bytes:
    from PIL import Image

    b = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(b, "PNG")
    return b.getvalue()


def test_link_and_device_members_of_a_tar_shard_are_read_or_listed(work):
    """Hard-link, symbolic-link and device members were dropped without a trace. A link to a member of the shard
    is read as that member; a link outside the shard is never followed; every other member named like an image
    is a failure with its reason; rows + failures = the image-named members."""
    from svgen.engine.blocks import plan_blocks
    from svgen.engine.predictions import decode_block

    png = _png()
    (work / "outside.png").write_bytes(png)
    links = {"001.png": (tarfile.LNKTYPE, "s/000.png"), "002.png": (tarfile.SYMTYPE, "000.png"),
             "003.png": (tarfile.SYMTYPE, str(work / "outside.png")), "004.png": (tarfile.SYMTYPE, "../../outside.png"),
             "005.png": (tarfile.SYMTYPE, "missing.png"), "006.png": (tarfile.CHRTYPE, ""),
             "007.png": (tarfile.FIFOTYPE, ""), "008.png": (tarfile.SYMTYPE, "009.png"),
             "009.png": (tarfile.SYMTYPE, "008.png"), "010.png": (tarfile.LNKTYPE, "nothere.png"),
             "010.cls": (tarfile.SYMTYPE, "x")}
    with tarfile.open(work / "links.tar", "w") as t:
        info = tarfile.TarInfo("s/000.png")
        info.size = len(png)
        t.addfile(info, io.BytesIO(png))
        for name, (kind, target) in links.items():
            info = tarfile.TarInfo(f"s/{name}")
            info.type, info.linkname = kind, target
            t.addfile(info)
    blocks = plan_blocks([str(work / "links.tar")], block_size=4)
    assert sum(b.size for b in blocks) == 11   # every member named like an image; the .cls link is a label
    ok, failed = [], {}
    for b in blocks:
        images, good, bad = decode_block(b, lambda im: torch.as_tensor(np.asarray(im, dtype=np.float32)))
        ok += good
        failed.update(bad)
        if good:
            assert all(torch.equal(images[0], im) for im in images)   # each link read the one image it names
    shard = str(work / "links.tar")
    assert ok == [f"{shard}/s/{n}" for n in ("000.png", "001.png", "002.png")]
    assert len(ok) + len(failed) == 11
    why = {k.rsplit("/", 1)[1]: v for k, v in failed.items()}
    assert "outside the shard" in why["003.png"] and "outside the shard" in why["004.png"]
    assert "not in the shard" in why["005.png"] and "not in the shard" in why["010.png"]
    assert "device" in why["006.png"] and "FIFO" in why["007.png"] and "loop" in why["008.png"]


# ----------------------------------------------------------------------------- 12. one input, one verdict

def test_a_big_endian_npy_is_taken_by_every_command(cli, work):
    """`classify` accepted a big-endian .npy and `adapt --shot-features` refused it with torch's message; both
    now convert it to native byte order when it is read."""
    x = np.load(work / "F.npy")
    np.save(work / "F_be.npy", x.astype(">f4"))
    np.save(work / "y_be.npy", np.load(work / "y.npy").astype(">i8"))
    code, native_out, err = cli("classify", "a.svgen", "--features", "F.npy", "--format", "jsonl")
    assert code == 0, err
    code, be_out, err = cli("classify", "a.svgen", "--features", "F_be.npy", "--format", "jsonl")
    assert code == 0, err
    assert [json.loads(r)["scores"] for r in be_out.splitlines()] == \
        [json.loads(r)["scores"] for r in native_out.splitlines()]
    for feats, labels, out in (("F.npy", "y.npy", "n.svgen"), ("F_be.npy", "y_be.npy", "b.svgen")):
        code, _, err = cli("adapt", "a.svgen", "--shot-features", feats, "--shot-labels", labels, "--out", out)
        assert code == 0, err
    q = x[:4]
    np.testing.assert_array_equal(SVGClassifier.load(work / "b.svgen").predict_proba(q),
                                  SVGClassifier.load(work / "n.svgen").predict_proba(q))


def _retensor(art, name, change):
    t = load_file(str(art / "weights.safetensors"))
    t[name] = change(t[name].clone())
    save_file({k: v.contiguous() for k, v in t.items()}, str(art / "weights.safetensors"))


def _every_command():
    return (("classify", "a.svgen", "--features", "F.npy"), ("export", "a.svgen", "--out", "h.safetensors"),
            ("adapt", "a.svgen", "--shot-features", "F.npy", "--shot-labels", "y.npy", "--out", "b.svgen"),
            ("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy"), ("diagnose", "a.svgen"))


def test_a_zero_prototype_row_is_refused_by_every_command_naming_it(cli, work):
    """classify and add-classes accepted a zero row in `prototypes`; export and adapt blamed something else."""
    def zero_row(p):
        p[2] = 0
        return p

    _retensor(work / "a.svgen", "prototypes", zero_row)
    before = tree(work)
    for argv in _every_command():
        one_line(*cli(*argv)[::2], "prototypes row 2", "'class 2'", "all zero")
        assert tree(work) == before


@pytest.mark.parametrize("field,value", [("dim", 17), ("n_support", 3), ("encoder", {"embed_dim": 32}),
                                         ("encoder", {"source": "prototypes", "images": {"embed_dim": 8}})])
def test_recorded_sizes_are_checked_against_the_tensors(cli, work, field, value):
    meta = json.loads((work / "a.svgen" / "svgen.json").read_text())
    meta[field] = value
    (work / "a.svgen" / "svgen.json").write_text(json.dumps(meta))
    before = tree(work)
    for argv in _every_command():
        line = one_line(*cli(*argv)[::2], "svgen.json says", "has shape")
        assert field in line
        assert tree(work) == before


def test_more_support_vectors_than_twice_the_dimension_is_one_line(cli, tmp_path):
    """-K above 2·D has no directions left to spread the support vectors along (an IndexError before)."""
    np.save(tmp_path / "p.npy", np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32))
    (tmp_path / "c.txt").write_text("a\nb\nc\n")
    code, _, err = cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", tmp_path / "c.txt", "-K", "9",
                       "--out", tmp_path / "a.svgen")
    one_line(code, err, "-K (support vectors per class) must be <= 2 × the embedding dimension (8 here), got 9")
    assert not (tmp_path / "a.svgen").exists()
    assert cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", tmp_path / "c.txt", "-K", "8",
               "--out", tmp_path / "a.svgen")[0] == 0
