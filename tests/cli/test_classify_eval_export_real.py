"""classify / eval / export on real data (../shared/data; skipped when absent).

* Real OpenAI CLIP ViT-B/32 embeddings of LVIS: the cosine head reproduces the plain CLIP
  baseline exactly, and every exported head predicts what `svgen classify` predicts.
* The 100 real JPEGs of images-30class with a random-weight open_clip model: classify and eval
  run end to end (labels.csv and ImageFolder layouts), unreadable files are skipped and
  reported, the encoder identity is enforced, and scripts/zero_shot_classify.py (open_clip and
  an exported head, nothing from svgen) agrees with `svgen classify`.
"""

import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from svgen.io.export import load_head

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "zero_shot_classify.py"


def rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def normalize(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


# ----------------------------------------------------------------------------- LVIS embeddings (fixture `lvis`: conftest)

def test_lvis_eval_reproduces_the_clip_baseline(cli, lvis):
    code, out, err = cli("eval", lvis["art"], "--features", lvis["feats"], "--labels", lvis["labels"], "--json")
    assert code == 0, err
    res = json.loads(out)
    # independent plain-CLIP computation from the raw files
    X, y = np.load(lvis["feats"]), np.load(lvis["labels"])
    s = normalize(X) @ normalize(np.load(lvis["protos"]).astype(np.float32)).T
    top5 = np.argsort(-s, axis=1)[:, :5]
    assert res["cosine"]["n"] == 602
    assert res["cosine"]["acc1"] == pytest.approx((s.argmax(1) == y).mean(), abs=1e-12)
    assert round(100 * res["cosine"]["acc1"], 2) == 62.62
    assert res["cosine"]["acc5"] == pytest.approx((top5 == y[:, None]).any(1).mean(), abs=1e-12)
    for head in ("kernel", "linear"):
        assert set(res[head]) >= {"acc1", "acc5", "mean_per_class_recall", "n"}
        assert res[head]["n"] == 602 and 0 < res[head]["acc1"] <= res[head]["acc5"] <= 1


@pytest.mark.parametrize("head", ["linear", "kernel"])
def test_lvis_exported_heads_predict_like_classify(cli, lvis, tmp_path, head):
    code, out, err = cli("classify", lvis["art"], "--features", lvis["feats"], "--head", head, "-k", 1)
    assert code == 0, err
    expected = [r["label_1"] for r in rows(out)]
    assert len(expected) == 602
    X = np.load(lvis["feats"])
    xh = normalize(X).astype(np.float32)
    for fmt in ("safetensors", "npz"):
        f = tmp_path / f"{head}.{fmt}"
        assert cli("export", lvis["art"], "--head", head, "--out", f)[0] == 0
        h = load_head(f)
        assert h["classes"] == lvis["classes"]
        if head == "linear":
            scores = float(h["logit_scale"]) * (xh @ h["weight"] + h["bias"])
        else:
            d2 = np.maximum(2 - 2 * xh @ h["support_vectors"].T, 0)
            scores = np.exp(-d2 / (2 * float(h["bandwidth"]) ** 2)) @ h["vote_weights"]
        assert [h["classes"][i] for i in scores.argmax(1)] == expected, fmt
    ort = pytest.importorskip("onnx") and pytest.importorskip("onnxruntime")
    f = tmp_path / f"{head}.onnx"
    assert cli("export", lvis["art"], "--head", head, "--out", f)[0] == 0
    sess = ort.InferenceSession(str(f), providers=["CPUExecutionProvider"])
    scores = sess.run(["scores"], {"embeddings": X.astype(np.float32)})[0]
    assert [lvis["classes"][i] for i in scores.argmax(1)] == expected


# ----------------------------------------------------------------------------- real JPEGs, tiny model (fixture `jpegs`: conftest)

def test_classify_and_eval_count_the_100_jpegs(cli, jpegs):
    code, out, err = cli("classify", jpegs["art"], jpegs["images"], *jpegs["enc"], "-k", 3)
    assert code == 0, err
    got = rows(out)
    assert len(got) == 100
    assert [Path(r["path"]).name for r in got] == [f"{i:03d}.jpg" for i in range(100)]
    assert all(r["label_1"] in jpegs["classes"] for r in got)
    code, out, err = cli("eval", jpegs["art"], "--data", jpegs["images"], *jpegs["enc"], "--json")
    assert code == 0, err
    res = json.loads(out)
    assert res.pop("default_head") == "kernel"
    assert {h: r["n"] for h, r in res.items()} == {"cosine": 100, "kernel": 100, "linear": 100}
    # the kernel head's acc1 agrees with classify's top-1 against labels.csv
    truth = {f: c for f, c in jpegs["labels"]}
    code, out, _ = cli("classify", jpegs["art"], jpegs["images"], *jpegs["enc"], "-k", 1, "--head", "kernel")
    acc = np.mean([r["label_1"] == truth[Path(r["path"]).name] for r in rows(out)])
    assert res["kernel"]["acc1"] == pytest.approx(acc)


def test_imagefolder_layout_gives_the_same_numbers(cli, jpegs, tmp_path):
    folder = tmp_path / "imagefolder"
    for f, c in jpegs["labels"]:
        d = folder / c.replace(" ", "_")  # brown_bear stands for "brown bear"
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(jpegs["images"] / f, d / f)
    a = json.loads(cli("eval", jpegs["art"], "--data", folder, *jpegs["enc"], "--json")[1])
    b = json.loads(cli("eval", jpegs["art"], "--data", jpegs["images"], *jpegs["enc"], "--json")[1])
    assert a.pop("default_head") == b.pop("default_head") == "kernel"
    for head in a:  # the images come in another order: float sums (nll, ece) may round apart
        assert a[head] == pytest.approx(b[head], rel=1e-12)
    assert {h: {k: v for k, v in r.items() if k not in ("nll", "ece")} for h, r in a.items()} == \
        {h: {k: v for k, v in r.items() if k not in ("nll", "ece")} for h, r in b.items()}
    (folder / "zebra").mkdir()
    code, out, err = cli("eval", jpegs["art"], "--data", folder, *jpegs["enc"])
    assert code == 2 and out == "" and "'zebra'" in err and len(err.strip().splitlines()) == 1


def test_unreadable_files_are_skipped_and_reported(cli, jpegs, tmp_path):
    folder = tmp_path / "mixed"
    shutil.copytree(jpegs["images"], folder)
    (folder / "notes.jpg").write_text("this is not an image")
    good = (folder / "000.jpg").read_bytes()
    (folder / "sub").mkdir()
    (folder / "sub" / "broken.jpg").write_bytes(good[: len(good) // 3])  # a truncated JPEG
    with open(folder / "labels.csv", "a") as f:
        f.write("notes.jpg,dog\nsub/broken.jpg,dog\n")
    code, out, err = cli("classify", jpegs["art"], folder, *jpegs["enc"])
    assert code == 0, err
    assert len(rows(out)) == 100
    assert "notes.jpg" in err and "broken.jpg" in err and "skipped 2 of 102" in err
    code, out, err = cli("eval", jpegs["art"], "--data", folder, *jpegs["enc"], "--json")
    assert code == 0 and json.loads(out)["linear"]["n"] == 100 and "skipped 2 of 102" in err


def test_empty_and_imageless_inputs_are_errors(cli, jpegs, tmp_path):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "a.jpg").write_bytes(b"\xff\xd8\xff garbage")
    out = tmp_path / "out.csv"
    for argv, msg in [
        (("classify", jpegs["art"], tmp_path / "empty", "--out", out), "no image files found"),
        (("eval", jpegs["art"], "--data", tmp_path / "empty", "--out", out), "is empty"),
        (("classify", jpegs["art"], tmp_path / "junk", "--out", out), "none of the 1 file(s)"),
        (("classify", jpegs["art"], tmp_path / "missing", "--out", out), "no such file or folder"),
    ]:
        code, stdout, err = cli(*argv, *jpegs["enc"])
        assert code == 2 and stdout == "" and msg in err and len(err.strip().splitlines()) == 1, (argv, err)
        assert not out.exists()


def test_encoder_identity_is_enforced(cli, jpegs, tiny_model, tmp_path):
    img = jpegs["images"] / "000.jpg"
    cfg = tiny_model["config"]
    for extra, msg in [
        (["--model", cfg], "pass it with --checkpoint"),
        (["--model", cfg, "--checkpoint", tiny_model["pt"]], "is not the one the artifact was fit with"),
        (["--model", cfg, "--pretrained", "openai"], "not pretrained tag"),
        (["--model", "ViT-B-32", "--checkpoint", tiny_model["safetensors"]], "does not match the artifact's encoder"),
    ]:
        code, out, err = cli("classify", jpegs["art"], img, *extra)
        assert code == 2 and out == "" and msg in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_prototypes_artifact_needs_a_named_encoder_of_the_right_dimension(cli, jpegs, tiny_model, tmp_path):
    rng = np.random.default_rng(0)
    img = jpegs["images"] / "000.jpg"
    for dim in (16, tiny_model["dim"]):
        np.save(tmp_path / f"p{dim}.npy", rng.normal(size=(30, dim)).astype(np.float32))
        art = tmp_path / f"p{dim}.svgen"
        assert cli("fit", "--prototypes", tmp_path / f"p{dim}.npy", "--classes", jpegs["root"] / "classes.txt",
                   "--steps", 2, "--ridge", 10, "--out", art)[0] == 0
        code, out, err = cli("classify", art, img)
        assert code == 2 and "precomputed prototypes" in err and "--model" in err
        code, out, err = cli("classify", art, img, *jpegs["enc"])
        if dim == 16:
            assert code == 2 and f"embeds to dimension {tiny_model['dim']} but the artifact expects 16" in err
        else:
            assert code == 0 and len(rows(out)) == 1


def test_zero_shot_script_needs_only_open_clip_and_agrees_with_classify(cli, jpegs, tmp_path):
    heads = {}
    for name, head, fmt in [("lin_st", "linear", "safetensors"), ("lin_npz", "linear", "npz"),
                            ("lin_onnx", "linear", "onnx"), ("ker_npz", "kernel", "npz"),
                            ("ker_onnx", "kernel", "onnx"), ("cos_st", "cosine", "safetensors")]:
        if fmt == "onnx":
            pytest.importorskip("onnx") and pytest.importorskip("onnxruntime")
        f = tmp_path / f"{name}.{fmt}"
        assert cli("export", jpegs["art"], "--head", head, "--out", f)[0] == 0
        heads[name] = (head, [str(f), str(jpegs["images"]), *jpegs["enc"], "-k", "2"])
    bad = {"bad_ckpt": [str(tmp_path / "lin_st.safetensors"), str(jpegs["images"] / "000.jpg"),
                        "--model", jpegs["enc"][1], "--checkpoint", str(Path(jpegs["enc"][3]).with_suffix(".pt"))]}
    runner = (
        "import sys, json, io, contextlib, runpy\n"
        "sys.modules['svgen'] = None  # any import of svgen fails\n"
        f"mod = runpy.run_path({str(SCRIPT)!r}, run_name='zsc')\n"
        "res = {}\n"
        "for name, argv in json.loads(sys.argv[1]).items():\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        res[name] = [mod['main'](argv), buf.getvalue()]\n"
        "assert not [m for m, v in sys.modules.items() if m.startswith('svgen') and v is not None]\n"
        "print(json.dumps(res))\n"
    )
    argvs = {**{k: v[1] for k, v in heads.items()}, **bad}
    proc = subprocess.run([sys.executable, "-c", runner, json.dumps(argvs)], capture_output=True, text=True,
                          timeout=300, env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["bad_ckpt"][0] == 2 and "is not the one the head was fit with" in proc.stderr
    reference = {}
    for name, (head, _) in heads.items():
        code, out = res[name]
        assert code == 0, name
        script_rows = rows(out)
        if head not in reference:
            reference[head] = cli("classify", jpegs["art"], jpegs["images"], *jpegs["enc"], "-k", 2, "--head", head)[1]
        ref_rows = rows(reference[head])
        assert len(script_rows) == len(ref_rows) == 100
        assert [(r["path"], r["label_1"], r["label_2"]) for r in script_rows] == \
               [(r["path"], r["label_1"], r["label_2"]) for r in ref_rows], name
        np.testing.assert_allclose([float(r["score_1"]) for r in script_rows],
                                   [float(r["score_1"]) for r in ref_rows], rtol=1e-4)
