"""`svgen classify --engine ray` on a bounded local Ray instance (2 CPUs, a 256 MB object store).

Ray starts once for the whole session (the ``ray_local`` fixture) and is shut down at the end;
`svgen classify --engine ray` run in-process uses that instance. Every prediction is checked
against single-process `svgen classify` (JSON Lines, full float precision) on the same inputs:
the 100 real JPEGs with a random-weight open_clip model and the real LVIS dev features, every
head. Tests that need no Ray (the one-line errors, hiding the module) run without it.
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest

from svgen.engine.blocks import plan_blocks


# ----------------------------------------------------------------------------- fixtures and helpers

@pytest.fixture(scope="session")
def ray_local():
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    pytest.importorskip("pyarrow")
    ray.init(num_cpus=2, object_store_memory=256 * 1024 * 1024, include_dashboard=False,
             logging_level="ERROR", log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def single(cli, *argv):
    """Single-process `svgen classify` rows as {key: (labels, scores)} in input order."""
    code, out, err = cli("classify", *argv, "--format", "jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    key = "index" if "index" in rows[0] else "path"
    return {r[key]: (r["labels"], r["probs" if "probs" in r else "scores"]) for r in rows}


def parts(out, key="path"):
    """The Ray output folder's predictions as {key: (labels, scores or probs)}, and its head column."""
    import pandas as pd

    df = pd.read_parquet(out)
    value = "probs" if "probs" in df.columns else "scores"
    return {k: (list(lab), list(val)) for k, lab, val in zip(df[key], df["labels"], df[value])}, set(df["head"])


def failures(out):
    import pyarrow.dataset as pads

    t = pads.dataset(str(Path(out) / "_failed"), format="parquet").to_table()
    return dict(zip(t.column("path").to_pylist(), t.column("reason").to_pylist()))


def assert_same(got, want, rtol=1e-5):
    assert list(got) == list(want)  # same inputs, same order
    for k in want:
        assert got[k][0] == want[k][0], k  # top-k labels
        np.testing.assert_allclose(got[k][1], want[k][1], rtol=rtol, atol=1e-7, err_msg=str(k))


RAY = ["--engine", "ray"]


# ----------------------------------------------------------------------------- same answers

@pytest.mark.parametrize("head", ["kernel", "linear", "cosine"])
def test_jpegs_match_single_process_for_every_head(cli, ray_local, jpegs, tmp_path, head):
    probs = ["--probs"] if head == "kernel" else []
    want = single(cli, jpegs["art"], jpegs["images"], *jpegs["enc"], "--head", head, "-k", 5, *probs)
    assert len(want) == 100
    out = tmp_path / "preds.parquet"
    code, _, err = cli("classify", jpegs["art"], jpegs["images"], *jpegs["enc"], "--head", head, "-k", 5, *probs,
                       *RAY, "--block-size", 40, "--out", out)
    assert code == 0, err
    got, heads = parts(out)
    assert heads == {head}
    assert sorted(p.name for p in out.glob("part-*.parquet")) == [f"part-0000{i}.parquet" for i in range(3)]
    assert_same(got, want)
    if probs:  # probabilities of the full softmax: the top-5 of each row sum to at most one
        assert all(0 < sum(v) <= 1 + 1e-9 for _, v in got.values())


@pytest.mark.parametrize("head,probs", [("kernel", False), ("linear", False), ("cosine", False), ("linear", True)])
def test_lvis_features_match_single_process(cli, ray_local, lvis, tmp_path, head, probs):
    flags = ["--head", head, "-k", 5] + (["--probs"] if probs else [])
    want = single(cli, lvis["art"], "--features", lvis["feats"], *flags)
    out = tmp_path / "preds.parquet"
    code, _, err = cli("classify", lvis["art"], "--features", lvis["feats"], *flags, *RAY, "--actors", 2,
                       "--block-size", 100, "--out", out)
    assert code == 0, err
    got, heads = parts(out, key="index")
    assert heads == {head} and len(got) == 602
    # Blocks of 100 rows instead of one 602-row matrix: float32 logits differ in the last bits, which
    # a softmax at the head's temperature turns into relative differences of about 1e-5.
    assert_same(got, want, rtol=1e-4 if probs else 1e-5)


def test_feature_shards_npy_and_parquet_number_rows_globally(cli, ray_local, lvis, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    x = np.load(lvis["feats"])
    np.save(tmp_path / "a.npy", x[:250])
    table = pa.table({"id": np.arange(250, 602), "embedding": list(x[250:].astype(np.float32))})
    pq.write_table(table, tmp_path / "b.parquet", row_group_size=64)  # blocks cut across row groups
    want = single(cli, lvis["art"], "--features", lvis["feats"], "-k", 3)
    out = tmp_path / "preds.parquet"
    code, _, err = cli("classify", lvis["art"], "--features", str(tmp_path / "*.npy"), tmp_path / "b.parquet",
                       "-k", 3, *RAY, "--block-size", 100, "--out", out)
    assert code == 0, err
    got, _ = parts(out, key="index")
    assert_same(got, want)
    import pandas as pd

    df = pd.read_parquet(out).sort_values("index")
    assert df["source"].tolist() == [str(tmp_path / "a.npy")] * 250 + [str(tmp_path / "b.parquet")] * 352
    assert df["row"].tolist() == list(range(250)) + list(range(352))


# ----------------------------------------------------------------------------- sources, failures

def test_every_kind_of_source_and_unreadable_files(cli, ray_local, jpegs, tmp_path):
    """Folder, glob, list file, CSV and Parquet columns of paths, a .tar shard and two bad files: one
    run, every readable image predicted as single-process classify does, every bad one in _failed."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = sorted(jpegs["images"].glob("*.jpg"))[:30]
    want = single(cli, jpegs["art"], *src, *jpegs["enc"], "-k", 3)
    groups = {name: src[5 * i:5 * i + 5] for i, name in enumerate(["dir", "glob", "list", "csv", "parquet", "tar"])}
    d = tmp_path / "dir"
    d.mkdir()
    for p in groups["dir"]:
        shutil.copy(p, d / p.name)
    g = tmp_path / "globbed"
    g.mkdir()
    for p in groups["glob"]:
        shutil.copy(p, g / p.name)
    (g / "notes.txt").write_text("not matched by the glob")
    (tmp_path / "bad.jpg").write_text("this is not a JPEG")
    (tmp_path / "cut.jpg").write_bytes(groups["list"][0].read_bytes()[:300])  # truncated
    (tmp_path / "list.txt").write_text("# images\n" + "\n".join(str(p) for p in groups["list"])
                                       + "\nbad.jpg\n\ncut.jpg\n")
    (tmp_path / "table.csv").write_text("id,path\n" + "".join(f"{i},{p}\n" for i, p in enumerate(groups["csv"])))
    pq.write_table(pa.table({"path": [str(p) for p in groups["parquet"]]}), tmp_path / "table.parquet")
    with tarfile.open(tmp_path / "shard-000.tar", "w") as tar:
        for p in groups["tar"]:
            tar.add(p, arcname=f"sample/{p.stem}.jpg")
            info = tarfile.TarInfo(f"sample/{p.stem}.json")  # WebDataset companions are not images
            info.size = 2
            tar.addfile(info, __import__("io").BytesIO(b"{}"))
    out = tmp_path / "preds.parquet"
    sources = [d, str(g / "*.jpg"), tmp_path / "list.txt", tmp_path / "table.csv", tmp_path / "table.parquet",
               tmp_path / "shard-000.tar"]
    code, _, err = cli("classify", jpegs["art"], *sources, *jpegs["enc"], "-k", 3, *RAY, "--block-size", 4,
                       "--out", out)
    assert code == 0, err
    assert "2 of 32 input(s) could not be read" in err
    got, _ = parts(out)
    assert len(got) == 30
    by_name = {Path(k).name: v for k, v in got.items()}
    assert {k for k in got if ".tar/" in k} == {f"{tmp_path / 'shard-000.tar'}/sample/{p.stem}.jpg"
                                                 for p in groups["tar"]}
    assert_same({p: by_name[Path(p).name] for p in want}, want)
    bad = failures(out)
    assert set(bad) == {str(tmp_path / "bad.jpg"), str(tmp_path / "cut.jpg")}
    assert bad[str(tmp_path / "bad.jpg")] == "not an image" and bad[str(tmp_path / "cut.jpg")]
    # rows + failures == inputs, and the plan counted the same inputs
    n = sum(b.size for b in plan_blocks([str(s) for s in sources], 4))
    assert n == 32 == len(got) + len(bad)


# ----------------------------------------------------------------------------- resumable and lossless

def test_rerun_finishes_only_missing_blocks_and_interrupts_leave_whole_blocks(cli, ray_local, lvis, tmp_path,
                                                                             monkeypatch):

    flags = [lvis["art"], "--features", lvis["feats"], "-k", 2, *RAY, "--block-size", 50]
    out = tmp_path / "preds.parquet"
    reference = tmp_path / "reference.parquet"
    assert cli("classify", *flags, "--out", reference)[0] == 0
    want, _ = parts(reference, key="index")

    # Ctrl-C during the rename of the second block (the job file was the first write): its temporary
    # file is removed, the first block stays whole
    from svgen import safeio      # the Ray engine writes its parts through safeio.atomic_file

    real, calls = safeio.os.replace, []

    def interrupted(src, dst):
        if Path(dst).parent == out:
            calls.append(dst)
            if len(calls) == 3:
                raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(safeio.os, "replace", interrupted)
    code, _, err = cli("classify", *flags, "--out", out)
    assert code == 130 and "interrupted" in err
    monkeypatch.setattr(safeio.os, "replace", real)
    written = sorted(p.name for p in out.glob("part-*.parquet"))
    assert len(written) == 1
    assert not list(out.glob(".*")) and not list((out / "_failed").glob(".*"))
    # a stale temporary file (a crash) is never taken for a block
    (out / ".part-00005.parquet.tmp-999").write_bytes(b"partial")
    first = {p.name: p.stat().st_mtime_ns for p in out.glob("part-*.parquet")}
    code, _, err = cli("classify", *flags, "--out", out)
    assert code == 0, err
    assert "1 of 13 block(s) already in" in err
    assert all((out / name).stat().st_mtime_ns == t for name, t in first.items())  # not redone
    assert not list(out.glob(".*"))
    got, _ = parts(out, key="index")
    assert_same(got, want, rtol=0)
    # everything done: nothing to do, nothing changes
    code, _, err = cli("classify", *flags, "--out", out)
    assert code == 0 and "13 of 13 block(s) already in" in err
    # a different job in the same folder is refused; --force starts over
    code, _, err = cli("classify", *flags[:-2], "--block-size", 60, "--out", out)
    assert code == 2 and "holds a different job (it differs in block_size, blocks, plan_sha256)" in err
    assert len(err.strip().splitlines()) == 1
    code, _, err = cli("classify", *flags[:-2], "--block-size", 60, "--out", out, "--force")
    assert code == 0, err
    assert len(list(out.glob("part-*.parquet"))) == 11


# ----------------------------------------------------------------------------- a quiet terminal

def test_a_ray_run_prints_only_its_summary_line(cli, jpegs, tmp_path):
    """`svgen classify --engine ray` as a user runs it (a fresh process starting its own local Ray):
    stderr is svgen's summary line alone — no Ray C++ log line (core_worker.cc "has constructor
    arguments in the object store", once per actor) and no warning (torch's non-writable-array
    UserWarning) — and the predictions are single-process classify's (issue 23, item 13)."""
    pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    src = sorted(jpegs["images"].glob("*.jpg"))[:12]
    want = single(cli, jpegs["art"], *src, *jpegs["enc"], "-k", 3)
    out = tmp_path / "preds.parquet"
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # never this session's instance: svgen starts (and stops) its own
    r = subprocess.run([sys.executable, "-c", "import sys; from svgen.cli import main; sys.exit(main(sys.argv[1:]))",
                        "classify", str(jpegs["art"]), *map(str, src), *map(str, jpegs["enc"]), "-k", "3", *RAY,
                        "--block-size", "5", "--cpus", "2", "--object-store-mb", "256", "--out", str(out)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    assert "core_worker" not in r.stderr and "object store" not in r.stderr, r.stderr
    assert "Warning" not in r.stderr and "writable" not in r.stderr, r.stderr
    assert r.stderr.splitlines() == [f"wrote {out}: 12 row(s) in 3 part(s), kernel head scores, top 3, Parquet"]
    assert r.stdout == ""
    got, _ = parts(out)
    assert_same(got, want)


def test_an_actor_that_dies_ends_the_run_in_one_line_and_keeps_nothing_partial(ray_local, jpegs, tmp_path):
    """A local run does not restart actors (see build_dataset): an actor that dies — here its encoder
    factory exits the process — ends the run with one error saying how to finish, not a traceback
    and not an endless restart of the same block."""
    from svgen import SVGClassifier
    from svgen.encoders.resolve import EncoderRequest, encoder_for_artifact
    from svgen.errors import SvgenError
    from svgen.engine.ray import run_blocks

    def dies(clf):
        os._exit(1)

    args = EncoderRequest(model=jpegs["enc"][1], checkpoint=jpegs["enc"][3], device="cpu")
    preprocess = encoder_for_artifact(args, SVGClassifier.load(jpegs["art"])).preprocess
    blocks = plan_blocks([str(jpegs["images"])], 50)
    out = tmp_path / "preds.parquet"
    (out / "_failed").mkdir(parents=True)
    with pytest.raises(SvgenError) as e:
        run_blocks(blocks, out, jpegs["art"], "kernel", False, 1, preprocess=preprocess, encoder_factory=dies,
                   restart_actors=False)
    assert str(e.value).startswith("a classifier actor died (")
    assert str(e.value).endswith("the 0 block(s) written are kept: rerun the same command to finish the rest")
    assert len(str(e.value).splitlines()) == 1
    assert not list(out.glob("part-*")) and not list(out.glob(".*"))


def _small_artifact(root):
    from svgen import SVGClassifier

    rng = np.random.default_rng(0)
    SVGClassifier(n_support=2).fit(rng.normal(size=(4, 16)).astype(np.float32),
                                   classes=["a", "b", "c", "d"]).save(root / "a.svgen")
    return root / "a.svgen", rng.normal(size=(12, 16)).astype(np.float32)


def test_nan_rows_are_failures_on_ray(cli, ray_local, tmp_path):
    """Issue 40, item 10: a NaN feature row ended the run in a 61-line RayTaskError and a partial output folder. It
    is a failure row now, with the row's reason, and the run ends well: rows + failures = inputs."""
    art, x = _small_artifact(tmp_path)
    x[3, 2], x[9] = np.nan, 0
    np.save(tmp_path / "bad.npy", x)
    out = tmp_path / "preds.parquet"
    code, _, err = cli("classify", art, "--features", tmp_path / "bad.npy", *RAY, "--block-size", 5, "--out", out)
    assert code == 0 and "Traceback" not in err, err
    failed = failures(out)
    assert sorted(failed) == [f"{tmp_path / 'bad.npy'}[3]", f"{tmp_path / 'bad.npy'}[9]"]
    assert "NaN or inf" in failed[f"{tmp_path / 'bad.npy'}[3]"]
    got, _ = parts(out, key="row")
    assert sorted(got) == [r for r in range(12) if r not in (3, 9)]


def test_a_blocks_own_error_on_ray_is_one_line(ray_local, tmp_path):
    """A block that raises in an actor (its shard damaged after planning) ends the run with svgen's one line, read
    out of the remote traceback Ray carries back, not a RayTaskError."""
    from svgen.errors import SvgenError
    from svgen.engine.ray import prepare_output, run_blocks

    art, x = _small_artifact(tmp_path)
    np.save(tmp_path / "x.npy", x)
    blocks = plan_blocks([str(tmp_path / "x.npy")], 6, features=True, dim=16)
    (tmp_path / "x.npy").write_bytes(b"garbage")
    out = tmp_path / "preds.parquet"
    prepare_output(out, {"blocks": len(blocks)})
    with pytest.raises(SvgenError) as e:
        run_blocks(blocks, out, art, "kernel", False, 1, restart_actors=False)
    assert str(e.value).startswith(f"a block failed (features file {tmp_path / 'x.npy'} has a damaged .npy header")
    assert len(str(e.value).splitlines()) == 1 and not list(out.glob("part-*"))


# ----------------------------------------------------------------------------- errors (no Ray needed)

def test_without_ray_one_line_says_what_to_install(cli, lvis, tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "ray" or m.startswith("ray.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    code, out, err = cli("classify", lvis["art"], "--features", lvis["feats"], *RAY, "--out", tmp_path / "p")
    assert code == 2 and out == ""
    assert err.strip() == ("svgen classify: error: --engine ray needs Ray: pip install 'svgen[ray]' "
                           "(or pip install 'ray[data]')")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("extra,message", [
    (["--format", "jsonl"], "--engine ray writes Parquet; drop --format"),
    (["--transductive"], "does not run with --engine ray"),
    (["--actors", "0"], "--actors must be at least 1"),
    (["--address", "tcp://x"], "--address takes 'auto' or ray://HOST:PORT"),
    (["--block-size", "0"], "--block-size must be at least 1"),
    (["--gpus-per-actor", "-1"], "--gpus-per-actor must be 0 or more"),
    (["--decode", "gpu"], "--decode gpu runs in one process"),
])   # --workers -1 is argparse's usage error for every engine (tests/reliability/test_issue40.py)
def test_bad_options_are_one_line(cli, lvis, tmp_path, extra, message):
    pytest.importorskip("ray")
    code, _, err = cli("classify", lvis["art"], "--features", lvis["feats"], *RAY, "--out", tmp_path / "p", *extra)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_out_must_be_given_and_not_a_file(cli, lvis, tmp_path):
    code, _, err = cli("classify", lvis["art"], "--features", lvis["feats"], *RAY)
    assert code == 2 and "--engine ray needs --out FOLDER" in err
    (tmp_path / "f.parquet").write_text("x")
    pytest.importorskip("ray")
    code, _, err = cli("classify", lvis["art"], "--features", lvis["feats"], *RAY, "--out", tmp_path / "f.parquet")
    assert code == 2 and "is a file" in err


def test_address_auto_without_a_cluster_is_one_line(lvis, tmp_path):
    """In a fresh process whose cluster discovery finds nothing: this test session's own Ray
    instance (a running gcs_server that 'auto' would otherwise find by scanning processes) is hidden."""
    pytest.importorskip("ray")
    env = dict(__import__("os").environ)
    env.pop("RAY_ADDRESS", None)
    code = ("import functools, sys, ray._private.services as s\n"
            "s._cached_find_gcs_addresses = functools.lru_cache()(lambda: [])\n"
            "s.find_bootstrap_address = lambda temp_dir: None\n"
            "from svgen.cli import main\n"
            "sys.exit(main(sys.argv[2:]))\n")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "ray"), "classify", str(lvis["art"]),
                        "--features", str(lvis["feats"]), *RAY, "--address", "auto", "--out", str(tmp_path / "p")],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith("svgen classify: error: cannot join the Ray cluster at auto: ")
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    assert not (tmp_path / "p").exists()


def test_ray_options_without_the_ray_engine_are_refused(cli, lvis):
    code, out, err = cli("classify", lvis["art"], "--features", lvis["feats"], "--actors", 4, "--block-size", 10)
    assert code == 2 and out == ""
    assert err.strip() == "svgen classify: error: --actors, --block-size only apply with --engine ray"


def test_block_classifier_in_process_equals_the_plan(lvis):
    """The actor's class used directly (no Ray): blocks cover every feature row once, in order."""
    pytest.importorskip("pyarrow")
    import io

    import pyarrow.parquet as pq

    from svgen.engine.ray import BlockClassifier

    blocks = plan_blocks([str(lvis["feats"])], 250, features=True, dim=512)
    assert [(b.spec["start"], b.spec["stop"], b.spec["id0"]) for b in blocks] == [(0, 250, 0), (250, 500, 250),
                                                                                 (500, 602, 500)]
    worker = BlockClassifier(str(lvis["art"]), "cosine", False, 1)
    ids = []
    for b in blocks:
        r = worker.classify(b)
        assert r["block"] == b.index and r["failed"] == b""
        ids += pq.read_table(io.BytesIO(r["part"])).column("index").to_pylist()
    assert ids == list(range(602))


def test_feature_rows_are_writable_so_torch_does_not_warn(lvis, tmp_path):
    """The shards are read-only (a memory-mapped .npy, Arrow's buffers); the rows an actor turns into a
    tensor are its own writable copy, so torch.from_numpy has nothing to warn about (issue 23)."""
    pytest.importorskip("pyarrow")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from svgen.engine.blocks import read_features

    x = np.load(lvis["feats"])
    pq.write_table(pa.table({"embedding": list(x[:200])}), tmp_path / "f.parquet", row_group_size=64)
    for got, want in [(read_features(lvis["feats"], 5, 150), x[5:150]),
                      (read_features(tmp_path / "f.parquet", 60, 130, "embedding"), x[60:130])]:
        assert type(got) is np.ndarray and got.dtype == np.float32
        assert got.flags.writeable and got.flags.c_contiguous
        np.testing.assert_array_equal(got, want)


def test_images_are_decoded_in_tasks_not_in_the_actors(ray_local, jpegs):
    """Ray Data fuses compatible stages; the decoding stage must stay its own (task) operator."""
    import functools

    from svgen import SVGClassifier
    from svgen.encoders.resolve import EncoderRequest, encoder_for_artifact
    from svgen.engine.ray import build_dataset

    args = EncoderRequest(model=jpegs["enc"][1], checkpoint=jpegs["enc"][3], device="cpu")
    clf = SVGClassifier.load(jpegs["art"])
    blocks = plan_blocks([str(jpegs["images"])], 50)
    ds = build_dataset(blocks, jpegs["art"], "kernel", False, 1, preprocess=encoder_for_artifact(args, clf).preprocess,
                       encoder_factory=functools.partial(encoder_for_artifact, args))
    rows = list(ds.iter_rows())
    assert sorted(int(r["block"]) for r in rows) == [0, 1]
    stats = ds.stats()
    assert "Map(_decode_row)" in stats and "MapBatches(BlockClassifier)" in stats
    assert "Map(_decode_row)->MapBatches(BlockClassifier)" not in stats  # not fused into the actor pool


# ----------------------------------------------------------------------------- GPU actors (issue 39)

def test_gpu_actors_on_a_cluster_that_declares_a_gpu_give_the_same_predictions(cli, jpegs, tmp_path):
    """``--gpus-per-actor 1`` on a local Ray that declares one GPU (Ray takes the count on trust): the actor is
    scheduled on it and given CUDA_VISIBLE_DEVICES; with no CUDA here ``--device auto`` falls back to the CPU in
    the actor, and the predictions are single-process classify's."""
    pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    src = sorted(jpegs["images"].glob("*.jpg"))[:10]
    want = single(cli, jpegs["art"], *src, *jpegs["enc"], "-k", 3)
    out = tmp_path / "preds.parquet"
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    code = ("import sys, ray\n"
            "ray.init(num_cpus=2, num_gpus=1, object_store_memory=256 * 1024 * 1024, include_dashboard=False,\n"
            "         logging_level='ERROR', log_to_driver=False)\n"
            "assert ray.cluster_resources().get('GPU') == 1\n"
            "from svgen.cli import main\n"
            "sys.exit(main(sys.argv[1:]))\n")
    r = subprocess.run([sys.executable, "-c", code, "classify", str(jpegs["art"]), *map(str, src),
                        *map(str, jpegs["enc"]), "-k", "3", *RAY, "--gpus-per-actor", "1", "--block-size", "5",
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    got, _ = parts(out)
    assert_same(got, want)


def test_more_gpus_than_the_cluster_has_is_one_line(ray_local, lvis, tmp_path):
    from svgen.engine.ray import run_blocks
    from svgen.errors import SvgenError

    blocks = plan_blocks([str(lvis["feats"])], 1000, features=True, dim=512)
    with pytest.raises(SvgenError) as e:
        run_blocks(blocks, tmp_path / "p", lvis["art"], "kernel", False, 1, gpus_per_actor=1)
    assert str(e.value) == ("1 actor(s) of 1 GPU(s) need 1 GPUs but the Ray cluster has 0; "
                            "use fewer actors or gpus_per_actor")


def test_gpus_per_actor_needs_the_ray_engine(cli, lvis):
    code, _, err = cli("classify", lvis["art"], "--features", lvis["feats"], "--gpus-per-actor", 1)
    assert code == 2 and err.strip() == "svgen classify: error: --gpus-per-actor only apply with --engine ray"
