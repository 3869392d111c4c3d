"""Regression tests for issue 24: each reproduces one attack of the red-team session (docs/reliability.md).

Nothing lost (--force, kill -9, races), nothing hung (FIFOs, /dev/zero, symlink loops), nothing
half-trusted (tampered svgen.json and tensors, NaN checks), every input accounted for (tar shards).
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from svgen import SVGClassifier
from svgen import safeio
from svgen.errors import SvgenError

from conftest import file_tree as tree, one_line, small_input_fixtures

C, D = 5, 16
NAMES = [f"class {i}" for i in range(C)]


files, work = small_input_fixtures(NAMES, D, "rel")   # the inputs, and a private copy the test runs in


def fit_args(out, *extra):
    return ("fit", "--prototypes", "P.npy", "--classes", "classes.txt", "-K", "2", "--out", out, *extra)


# ----------------------------------------------------------------------------- 1. --force replaces only artifacts

@pytest.mark.parametrize("command", ["fit", "adapt"])
def test_force_refuses_a_folder_that_is_not_an_artifact(cli, work, command):
    photos = work / "photos"
    photos.mkdir()
    (photos / "holiday.jpg").write_bytes(b"precious")
    before = tree(work)
    argv = fit_args(photos, "--force") if command == "fit" else (
        "adapt", "a.svgen", "--shot-features", "F.npy", "--shot-labels", "y.npy", "--out", photos, "--force")
    code, _, err = cli(*argv)
    one_line(code, err, "not an svgen artifact", "left as it is")
    assert tree(work) == before


@pytest.mark.parametrize("out", ["", "/", ".", ".."])
def test_force_refuses_root_empty_and_current_folder(cli, work, out):
    before, root = tree(work), sorted(os.listdir("/"))
    code, _, err = cli(*fit_args(out, "--force"))
    one_line(code, err)
    assert tree(work) == before and sorted(os.listdir("/")) == root  # no '..old-*' left in / either


def test_force_replaces_an_artifact_and_an_empty_folder(cli, work):
    (work / "empty").mkdir()
    assert cli(*fit_args("empty", "--force"))[0] == 0
    assert sorted(os.listdir("empty")) == ["svgen.json", "weights.safetensors"]
    old = (work / "a.svgen" / "weights.safetensors").read_bytes()
    assert cli(*fit_args("a.svgen", "--force", "--seed", "3", "--steps", "2"))[0] == 0
    assert (work / "a.svgen" / "weights.safetensors").read_bytes() != old
    assert not [p for p in os.listdir(work) if p.startswith(".")]


# ----------------------------------------------------------------------------- 2. truncated tar shards

def _shard(path: Path, n: int = 20) -> list:
    from PIL import Image

    with tarfile.open(path, "w") as t:
        for i in range(n):
            b = io.BytesIO()
            Image.new("RGB", (8, 8), (10 * i, 0, 0)).save(b, "PNG")
            info = tarfile.TarInfo(f"{i:03d}.png")
            info.size = len(b.getvalue())
            t.addfile(info, io.BytesIO(b.getvalue()))
    with tarfile.open(path) as t:
        return [m.offset for m in t.getmembers()]


@pytest.mark.parametrize("where", ["header boundary", "inside a header", "inside a member"])
def test_truncated_tar_shard_is_a_failure_not_a_silent_drop(tmp_path, where):
    from svgen.engine.blocks import plan_blocks
    from svgen.engine.predictions import decode_block

    headers = _shard(tmp_path / "whole.tar")
    data = (tmp_path / "whole.tar").read_bytes()
    cut = {"header boundary": headers[11], "inside a header": headers[11] + 100,
           "inside a member": headers[11] + 512 + 10}[where]
    (tmp_path / "cut.tar").write_bytes(data[:cut])
    blocks = plan_blocks([str(tmp_path / "cut.tar")], block_size=4)
    inputs = sum(b.size for b in blocks)
    ok = failed = 0
    reasons = []
    for b in blocks:
        _, good, bad = decode_block(b, lambda im: torch.zeros(3, 4, 4))
        ok, failed = ok + len(good), failed + len(bad)
        reasons += [r for _, r in bad]
    assert ok == 11 and failed >= 1 and ok + failed == inputs
    assert any("truncated" in r for r in reasons)


def test_whole_tar_shard_has_no_phantom_failure(tmp_path):
    from svgen.engine.blocks import plan_blocks

    _shard(tmp_path / "whole.tar")
    assert sum(b.size for b in plan_blocks([str(tmp_path / "whole.tar")], block_size=8)) == 20


# ----------------------------------------------------------------------------- 4. symlink loops in globs

def test_glob_over_symlink_loops_ends_and_takes_each_file_once(tmp_path):
    from svgen.engine.blocks import glob_files, plan_blocks

    leaf = tmp_path / "loop" / "a" / "b"
    leaf.mkdir(parents=True)
    for i in range(15):
        (leaf / f"{i}.jpg").write_bytes(b"x")
    os.symlink("..", leaf / "up")        # two loops: without care the walk is exponential
    os.symlink("../..", leaf / "up2")
    os.symlink(str(tmp_path / "loop"), tmp_path / "loop" / "again")
    found = glob_files(str(tmp_path / "loop" / "**" / "*.jpg"))
    assert len(found) == 15 and len({f.resolve() for f in found}) == 15
    assert len(glob_files(str(tmp_path / "loop" / "*" / "*" / "*" / "*.jpg"))) == 15
    blocks = plan_blocks([str(tmp_path / "loop" / "**" / "*.jpg")], block_size=100)
    assert sum(b.size for b in blocks) == 15


# ----------------------------------------------------------------------------- 5. bounded reads

@pytest.mark.parametrize("name, kind", [(n, k) for n in ("svgen.json", "weights.safetensors")
                                         for k in ("dev-zero", "fifo", "folder")] + [("svgen.json", "huge")])
def test_artifact_files_are_read_only_when_regular_and_bounded(cli, work, kind, name, monkeypatch):
    target = work / "a.svgen" / name
    target.unlink()
    if kind == "dev-zero":
        os.symlink("/dev/zero", target)
    elif kind == "fifo":
        os.mkfifo(target)  # opened for reading it would block forever
    elif kind == "folder":
        target.mkdir()
    else:  # weights.safetensors is memory-mapped, never read whole
        monkeypatch.setattr(safeio, "MAX_JSON_BYTES", 1000)
        monkeypatch.setattr(safeio.read_regular, "__defaults__", (1000, *safeio.read_regular.__defaults__[1:]))
        target.write_text(json.dumps({"format_version": 1, "classes": NAMES, "pad": "x" * 5000}))
    code, _, err = cli("classify", "a.svgen", "--features", "F.npy")
    one_line(code, err, name)


# ----------------------------------------------------------------------------- 6. atomic exchange, recovery

@pytest.mark.parametrize("native", [True, False])
def test_exchange_swaps_in_one_step_or_recovers(tmp_path, monkeypatch, native):
    if not native:
        monkeypatch.setattr(safeio, "_renameat2", None)  # the two-rename fallback
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "f").write_text("new")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "f").write_text("old")
    safeio.exchange(tmp_path / "new", tmp_path / "t")
    assert (tmp_path / "t" / "f").read_text() == "new" and (tmp_path / "new" / "f").read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["new", "t"]


def test_next_write_restores_a_parked_artifact_and_removes_leftovers(cli, work):
    """A kill between the fallback's two renames leaves the old artifact in .NAME.old-*/artifact and the
    new one in .NAME.tmp-*: the next run puts the old one back and removes the rest."""
    old = tree(work / "a.svgen")
    parked = work / ".a.svgen.old-dead"
    parked.mkdir()
    os.rename(work / "a.svgen", parked / "artifact")
    (work / ".a.svgen.tmp-dead").mkdir()
    (work / ".a.svgen.tmp-dead" / "weights.safetensors").write_bytes(b"partial" * 1000)
    code, _, err = cli(*fit_args("a.svgen"))          # without --force: refused, but nothing is lost
    one_line(code, err, "already exists", "--force")
    assert tree(work / "a.svgen") == old
    assert not [p for p in os.listdir(work) if p.startswith(".a.svgen.")]


def test_leftover_file_temporaries_are_removed_by_the_next_write(work):
    from svgen.safeio import atomic_text

    (work / ".out.csv.tmp-dead.csv").write_bytes(b"x" * 12_000)
    atomic_text(work / "out.csv", "a\n")
    assert (work / "out.csv").read_text() == "a\n"
    assert not [p for p in os.listdir(work) if p.startswith(".out.csv.")]


def test_a_live_writers_temporary_is_never_removed(work):
    with safeio.temporary(work / "x.svgen", directory=True) as tmp:
        assert safeio.leftovers(work / "x.svgen") == []
        safeio.recover(work / "x.svgen")
        assert tmp.is_dir()
    assert not tmp.exists()


# ----------------------------------------------------------------------------- 7. races

def _intruder(monkeypatch, work, target):
    """Patch the weights writer so another process's artifact appears at ``target`` while this one writes."""
    import svgen.io.artifacts as artifacts

    real = artifacts.save_file

    def racing(tensors, path):
        if not os.path.lexists(target):
            shutil.copytree(work / "a.svgen", target)
            (target / "svgen.json").write_text((target / "svgen.json").read_text().replace('"kernel": "rbf"',
                                                                                           '"kernel": "rbf", "x": 1'))
        real(tensors, path)

    monkeypatch.setattr(artifacts, "save_file", racing)


def test_a_concurrent_writer_is_refused_not_silently_replaced(cli, work, monkeypatch):
    _intruder(monkeypatch, work, work / "b.svgen")
    code, _, err = cli(*fit_args("b.svgen"))
    line = one_line(code, err, "appeared", "--force")
    assert "force=True" not in line
    assert '"x": 1' in (work / "b.svgen" / "svgen.json").read_text()  # the other writer's artifact stands
    assert not [p for p in os.listdir(work) if p.startswith(".b.svgen.")]


def test_force_race_has_no_traceback_and_no_orphan(cli, work, monkeypatch):
    _intruder(monkeypatch, work, work / "b.svgen")
    code, _, err = cli(*fit_args("b.svgen", "--force"))
    assert code == 0, err
    assert '"x": 1' not in (work / "b.svgen" / "svgen.json").read_text()
    SVGClassifier.load(work / "b.svgen")
    assert not [p for p in os.listdir(work) if p.startswith(".b.svgen.")]


# ----------------------------------------------------------------------------- 8. non-finite and huge values

def _retensor(art: Path, **changes):
    t = load_file(str(art / "weights.safetensors"))
    for k, f in changes.items():
        t[k.replace("__", ".")] = f(t[k.replace("__", ".")])
    save_file({k: v.contiguous() for k, v in t.items()}, str(art / "weights.safetensors"))


@pytest.mark.parametrize("value", [1e30, 3e38])
def test_huge_vote_weights_are_refused_at_load(cli, work, value):
    _retensor(work / "a.svgen", vote_weights=lambda v: v * 0 + value)
    code, _, err = cli("export", "a.svgen", "--format", "onnx", "--head", "kernel", "--out", "k.onnx")
    one_line(code, err, "vote_weights")
    assert not (work / "k.onnx").exists()


@pytest.mark.parametrize("what", ["temperature", "vote_weights", "meta"])
def test_an_artifact_svgen_could_not_read_is_never_written(work, what):
    """Save runs the loader's checks first: a value the loader refuses (a temperature of 1e13 once was one) is one
    error line, and neither the new artifact nor the one it would replace is touched."""
    clf = SVGClassifier.load(work / "a.svgen")
    before = tree(work / "a.svgen")
    if what == "temperature":
        clf.heads_.calibration.temperatures["linear"] = 1e13
    elif what == "vote_weights":
        clf.heads_.kernel.votes = clf.heads_.kernel.votes * 0 + 1e30
    else:
        clf.fit_metrics_["sigma"] = "wide"
    for out, force in ((work / "new.svgen", False), (work / "a.svgen", True)):
        with pytest.raises(SvgenError, match="not written") as e:
            clf.save(out, force=force)
        assert "\n" not in str(e.value)
    assert not (work / "new.svgen").exists() and tree(work / "a.svgen") == before


def test_onnx_check_fails_on_nan(work, monkeypatch):
    pytest.importorskip("onnxruntime")
    import svgen.io.onnx_graph as graph

    clf = SVGClassifier.load(work / "a.svgen")
    model = graph.onnx_model(clf, "kernel")
    monkeypatch.setattr(graph, "torch_scores", lambda clf, x, head: np.full((len(x), C), np.nan, np.float32))
    with pytest.raises(SvgenError, match="NaN"):
        graph.verify_onnx(model, clf, "kernel")


@pytest.mark.parametrize("exponent", [116, -149])  # rows near 1e38 (the norm overflows) and 1e-42 (it underflows)
def test_extreme_rows_keep_their_direction(work, exponent):
    clf = SVGClassifier.load(work / "a.svgen")
    k = np.random.default_rng(1).integers(-1000, 1000, size=(3, D)).astype(np.float32)
    x = (k.astype(np.float64) * 2.0 ** exponent).astype(np.float32)  # exact: the same directions as k
    assert np.isfinite(x).all() and (x.astype(np.float64) == k * 2.0 ** exponent).all()
    for head in ("kernel", "linear", "cosine"):
        np.testing.assert_allclose(clf.decision_function(x, head), clf.decision_function(k, head),
                                   rtol=1e-4, atol=1e-5)


def test_extreme_rows_match_in_onnx(work):
    ort = pytest.importorskip("onnxruntime")
    import svgen.io.export as export

    clf = SVGClassifier.load(work / "a.svgen")
    x = np.load(work / "F.npy")[:3]
    x = (x / np.abs(x).max(1, keepdims=True) * np.float32(1e38)).astype(np.float32)
    sess = ort.InferenceSession(export.onnx_model(clf, "kernel").SerializeToString(),
                                providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(sess.run(["scores"], {"embeddings": x})[0], clf.decision_function(x, "kernel"),
                               rtol=1e-4, atol=1e-5)


def test_zero_rows_are_still_refused_and_complex_features_too(cli, work):
    clf = SVGClassifier.load(work / "a.svgen")
    with pytest.raises(SvgenError, match="all-zero"):
        clf.decision_function(np.zeros((2, D), np.float32))
    with pytest.raises(SvgenError, match="complex"):
        clf.decision_function(np.ones((2, D), np.complex64))
    np.save(work / "Z.npy", (np.load(work / "F.npy") + 1j).astype(np.complex64))
    one_line(*cli("classify", "a.svgen", "--features", "Z.npy")[::2], "complex")


# ----------------------------------------------------------------------------- 9. one line, never a traceback

META_ATTACKS = {
    "kernel": lambda m: m.update(kernel=5),
    "fit": lambda m: m.update(fit="x"),
    "fit.ridge": lambda m: m["fit"].update(ridge=[1]),
    "fit.radius": lambda m: m["fit"].update(radius=1e308),
    "metrics": lambda m: m.update(metrics=[1]),
    "metrics.geometry": lambda m: m["metrics"].update(geometry=1.5),
    "metrics.ridge_lambda": lambda m: m["metrics"].update(ridge_lambda=-1),
    "encoder": lambda m: m.update(encoder=3),
    "embed_dim": lambda m: m.update(encoder={"model": "ViT-B-32", "embed_dim": "x"}),
    "quick_gelu": lambda m: m.update(encoder={"model": "ViT-B-32", "quick_gelu": "yes"}),
    "classes int": lambda m: m.update(classes=[1, 2, 3, 4, 5]),
    "classes null": lambda m: m["classes"].__setitem__(0, None),
    "format_version true": lambda m: m.update(format_version=True),
    "vote_weights_scale": lambda m: m.update(vote_weights_scale="x"),
    "vote_weights_scale no factor": lambda m: m.update(vote_weights_scale={"rule": "x"}),
}


@pytest.mark.parametrize("attack", sorted(META_ATTACKS))
def test_tampered_svgen_json_is_one_line(cli, work, attack):
    meta = json.loads((work / "a.svgen" / "svgen.json").read_text())
    META_ATTACKS[attack](meta)
    (work / "a.svgen" / "svgen.json").write_text(json.dumps(meta))
    for argv in (("classify", "a.svgen", "--features", "F.npy"), ("diagnose", "a.svgen"),
                 ("add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")):
        before = tree(work)
        code, out, err = cli(*argv)
        one_line(code, err, "svgen.json")
        assert out == "" and tree(work) == before


@pytest.mark.parametrize("text", ['{"format_version": 1, "classes": ["a", "b"], "x": NaN}',
                                  '{"format_version": 1, "classes": ["a", "b"], "x": 1e999}',
                                  "[" * 200_000 + "]" * 200_000,
                                  '{"a": ' * 100 + "1" + "}" * 100])
def test_non_json_and_deep_nesting_are_one_line(cli, work, text):
    (work / "a.svgen" / "svgen.json").write_text(text)
    one_line(*cli("diagnose", "a.svgen")[::2], "svgen.json")


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64, torch.int32, torch.bool, torch.complex64])
def test_support_vectors_of_another_dtype_are_refused(cli, work, dtype):
    _retensor(work / "a.svgen", support_vectors=lambda v: v.to(dtype))
    one_line(*cli("classify", "a.svgen", "--features", "F.npy")[::2], "support_vectors")


def test_npy_header_claiming_terabytes_is_checked_before_allocating(cli, work):
    with open(work / "huge.npy", "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (10**12, 512)})
        f.write(b"\0" * 1000)
    one_line(*cli("classify", "a.svgen", "--features", "huge.npy")[::2], "claims shape")


@pytest.mark.parametrize("flags", [("-K", "100000"), ("--seed", "-1"), ("--lr", "1e30"),
                                   ("--metric-strength", "inf"), ("--margin-weight", "nan"), ("--steps", "100000000000"),
                                   ("--ridge", "inf")])
def test_out_of_range_fit_settings_are_one_line(cli, work, flags):
    before = tree(work)
    one_line(*cli(*fit_args("new.svgen", *flags))[::2], flags[0].lstrip("-").split("-")[0])
    assert tree(work) == before


@pytest.mark.parametrize("err_no", [errno.ENOSPC, errno.EACCES, errno.EROFS])
def test_full_disk_or_unwritable_folder_is_one_line_and_leaves_nothing(cli, work, monkeypatch, err_no):
    import svgen.io.artifacts as artifacts

    def failing(tensors, path):
        Path(path).write_bytes(b"partial")
        raise OSError(err_no, os.strerror(err_no), str(path))

    monkeypatch.setattr(artifacts, "save_file", failing)
    before = tree(work)
    for out in ("new.svgen", "a.svgen"):
        one_line(*cli(*fit_args(out, "--force"))[::2], os.strerror(err_no))
        assert tree(work) == before


def test_unwritable_output_folder_is_one_line(cli, work, monkeypatch):
    import tempfile

    def denied(*a, **k):
        raise PermissionError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "mkdtemp", denied)
    one_line(*cli(*fit_args("new.svgen"))[::2], "Permission denied")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads and writes whatever the permissions say")
def test_unreadable_files_are_one_line_real_permissions(cli, work):
    os.chmod(work / "a.svgen" / "svgen.json", 0)
    one_line(*cli("diagnose", "a.svgen")[::2], "Permission denied")
    os.chmod(work / "a.svgen" / "svgen.json", 0o644)
    ro = work / "ro"
    ro.mkdir(mode=0o555)
    one_line(*cli(*fit_args(ro / "x.svgen"))[::2], "Permission denied")


# ----------------------------------------------------------------------------- 11. messages that say what happened

def test_unreadable_is_not_reported_as_missing(tmp_path, monkeypatch):
    real = os.stat

    def denied(path, *a, **k):
        if str(path).endswith("locked.safetensors"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "stat", denied)
    with pytest.raises(SvgenError) as e:
        safeio.check_regular(tmp_path / "locked.safetensors", "checkpoint file")
    assert "Permission denied" in str(e.value) and "not found" not in str(e.value)
    with pytest.raises(SvgenError, match="not found"):
        safeio.check_regular(tmp_path / "absent.safetensors", "checkpoint file")


def test_sha_mismatch_names_two_different_encoders():
    from svgen.encoders.resolve import encoder_mismatch

    a = {"model": "ViT-B-32", "pretrained": None, "checkpoint": "w.pt", "checkpoint_sha256": "a" * 64}
    b = {**a, "checkpoint_sha256": "b" * 64}
    text = str(encoder_mismatch(a, b))
    first, second = text.split(" does not match ")
    assert "aaaaaaaaaaaa" in first and "bbbbbbbbbbbb" in second


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("command", ["fit", "add-classes"])
def test_device_cuda_without_cuda_is_refused_even_without_an_encoder(cli, work, command):
    argv = fit_args("new.svgen", "--device", "cuda") if command == "fit" else (
        "add-classes", "a.svgen", "--classes", "new.txt", "--prototypes", "P2.npy", "--device", "cuda")
    before = tree(work)
    one_line(*cli(*argv)[::2], "CUDA")
    assert tree(work) == before


@pytest.mark.parametrize("kind", ["fifo", "dev-zero"])
def test_class_and_list_files_that_are_not_regular_are_one_line(cli, work, kind):
    from svgen.engine.blocks import plan_blocks

    for name in ("fifo.txt", "list.lst"):
        os.mkfifo(work / name) if kind == "fifo" else os.symlink("/dev/zero", work / name)
    one_line(*cli("fit", "--prototypes", "P.npy", "--classes", "fifo.txt", "--out", "n.svgen")[::2], "fifo.txt")
    with pytest.raises(SvgenError, match="list.lst"):
        plan_blocks([str(work / "list.lst")], block_size=4)


def test_a_file_that_appears_while_written_is_not_replaced(work):
    from svgen.errors import TargetExistsError
    from svgen.safeio import atomic_file

    def racing(tmp):
        (work / "out.npz").write_bytes(b"theirs")
        tmp.write_bytes(b"ours")

    with pytest.raises(TargetExistsError):
        atomic_file(work / "out.npz", racing)
    assert (work / "out.npz").read_bytes() == b"theirs"
    assert not [p for p in os.listdir(work) if p.startswith(".out.npz.")]


def test_add_classes_through_a_link_updates_the_artifact_it_names(cli, work):
    os.symlink("a.svgen", work / "latest.svgen")
    code, _, err = cli("add-classes", "latest.svgen", "--classes", "new.txt", "--prototypes", "P2.npy")
    assert code == 0, err
    assert (work / "latest.svgen").is_symlink()
    assert len(json.loads((work / "a.svgen" / "svgen.json").read_text())["classes"]) == C + 2
    assert not [p for p in os.listdir(work) if p.startswith(".")]


@pytest.fixture
def tiny_disk(tmp_path):
    """A 64 kB tmpfs: a real full disk (needs root and mount; skipped elsewhere)."""
    import subprocess

    where = tmp_path / "disk"
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)],
                                           capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], capture_output=True)


def test_a_really_full_disk_is_one_line_for_artifacts_and_exports(cli, work, tiny_disk):
    rng = np.random.default_rng(0)
    names = [f"n{i}" for i in range(40)]
    (work / "many.txt").write_text("\n".join(names) + "\n")
    np.save(work / "big.npy", rng.normal(size=(40, 2, 64)).astype(np.float32))  # > 64 kB of tensors
    code, _, err = cli("fit", "--prototypes", "big.npy", "--classes", "many.txt", "--out", tiny_disk / "x.svgen")
    one_line(code, err, "No space left on device")
    assert os.listdir(tiny_disk) == []
    assert cli("fit", "--prototypes", "big.npy", "--classes", "many.txt", "--out", "big.svgen")[0] == 0
    for fmt in ("safetensors", "npz", "onnx"):
        code, _, err = cli("export", "big.svgen", "--head", "kernel", "--out", tiny_disk / f"k.{fmt}")
        one_line(code, err, "No space left on device")
        assert os.listdir(tiny_disk) == []


def test_a_temporary_not_yet_locked_by_a_live_writer_is_kept(work):
    """The instant between a writer creating its temporary and locking it: the process id in the name
    keeps the next writer's cleanup off it; once that process is gone, it is removed."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    for name in ("x.svgen", "my-art.svgen"):
        alive = work / f".{name}.tmp-{os.getppid()}-abcd"
        alive.mkdir()
        dead = work / f".{name}.old-{child.pid}-efgh"
        dead.mkdir()
        safeio.recover(work / name)
        assert alive.is_dir() and not dead.exists()
