"""Every way of naming the weights, end to end: fit, then classify and eval images and classify them
with an exported head through ``scripts/zero_shot_classify.py``, with no flags beyond the ones each
path needs (a checkpoint file must be given again; tags, ``hf-hub:`` and ``local-dir:`` reload
themselves). Tags and ``hf-hub:`` read a Hugging Face cache seeded in the real layout, offline
(helpers from ``test_quick_gelu``); the images are small generated PNGs, so nothing outside the
repository is needed.
"""

from __future__ import annotations

import csv
import io
import json
import runpy
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.torch import save_file

from conftest import TINY_CFG
from test_quick_gelu import _seed_repo, _seed_tag, _state, _weights_bytes, hf_cache  # noqa: F401 (fixture)

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ["cat", "dog", "car"]


@pytest.fixture
def image_folder(tmp_path):
    """An ImageFolder (one sub-folder per class) of 2 random 40×40 PNGs per class."""
    from PIL import Image

    rng = np.random.default_rng(0)
    root = tmp_path / "images"
    for c in CLASSES:
        (root / c).mkdir(parents=True)
        for i in range(2):
            Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


def _local_dir(tmp_path, seed=0):
    folder = tmp_path / f"local-{seed}"
    folder.mkdir()
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": {}}))
    save_file(_state(seed), str(folder / "open_clip_model.safetensors"))
    return folder


def _script(capsys, *argv):
    main = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))["main"]
    capsys.readouterr()
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _rows(text):
    return list(csv.DictReader(io.StringIO(text)))


def _paths(request, tmp_path, tiny_model):
    """(fit args, args classify/eval/the script need again) for one loading path."""
    kind = request.param if hasattr(request, "param") else request
    if kind == "tag":
        _seed_tag(request.getfixturevalue("hf_cache"), tmp_path)
        return [], []
    if kind == "hf-hub":
        cfg = {"model_cfg": TINY_CFG, "preprocess_cfg": {}}
        _seed_repo(request.getfixturevalue("hf_cache"), "svgen-test/tiny",
                   {"open_clip_config.json": json.dumps(cfg).encode(),
                    "open_clip_model.safetensors": _weights_bytes(_state(), tmp_path)})
        return ["--model", "hf-hub:svgen-test/tiny"], []
    if kind == "local-dir":
        return ["--model", f"local-dir:{_local_dir(tmp_path)}"], []
    if kind == "checkpoint":
        return ["--model", "svgen-tiny", "--checkpoint", tiny_model["safetensors"]], ["--checkpoint", tiny_model["safetensors"]]
    if kind == "config+checkpoint":
        ckpt = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
        return ckpt, ckpt
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["tag", "hf-hub", "local-dir", "checkpoint", "config+checkpoint"])
def test_every_loading_path_classifies_and_evaluates_images(kind, request, tmp_path, tiny_model, cli, classes_file,
                                                            image_folder, capsys):
    request.param = kind
    fit_args, again = _paths(request, tmp_path, tiny_model)
    art = tmp_path / "art"
    code, out, err = cli("fit", "--classes", classes_file(CLASSES), "--out", art, *fit_args)
    assert code == 0, err
    enc = json.loads((art / "svgen.json").read_text())["encoder"]
    if kind in ("hf-hub", "local-dir", "checkpoint", "config+checkpoint"):
        assert len(enc["checkpoint_sha256"]) == 64  # the weights are identified by their bytes

    code, out, err = cli("classify", art, image_folder, "--head", "linear", "--top-k", 2, *again)
    assert code == 0, err
    rows = _rows(out)
    assert [Path(r["path"]).name for r in rows] == ["0.png", "1.png"] * 3
    assert all(r["label_1"] in CLASSES and r["label_2"] in CLASSES for r in rows)

    code, out, err = cli("eval", art, "--data", image_folder, "--json", *again)
    assert code == 0, err
    res = json.loads(out)
    assert set(res) == {"cosine", "kernel", "linear", "default_head"} and res["default_head"] == "kernel"
    assert all(res[h]["n"] == 6 for h in ("cosine", "kernel", "linear"))

    head = tmp_path / "head.safetensors"
    code, _, err = cli("export", art, "--out", head, "--head", "linear")
    assert code == 0, err
    code, out, err = _script(capsys, head, image_folder, "--top-k", 2, *again)
    assert code == 0, err
    theirs = _rows(out)
    assert [r["label_1"] for r in theirs] == [r["label_1"] for r in rows]
    np.testing.assert_allclose([float(r["score_1"]) for r in theirs], [float(r["score_1"]) for r in rows], rtol=1e-4)

    code, out, err = cli("classify", art, image_folder, "--head", "linear", "--top-k", 2, "--probs", *again)
    assert code == 0, err
    ours = _rows(out)
    code, out, err = _script(capsys, head, image_folder, "--top-k", 2, "--probs", *again)
    assert code == 0, err
    theirs = _rows(out)
    assert [r["label_1"] for r in theirs] == [r["label_1"] for r in ours]
    np.testing.assert_allclose([float(r["prob_1"]) for r in theirs], [float(r["prob_1"]) for r in ours], rtol=1e-4)
    assert all(0 < float(r["prob_1"]) <= 1 for r in ours)

    code, out, err = cli("add-classes", art, "--classes", classes_file(["bird"], "more.txt"), *again)
    assert code == 0, err
    assert json.loads((art / "svgen.json").read_text())["classes"] == CLASSES + ["bird"]


def test_local_dir_weights_that_changed_are_refused_in_one_line(tmp_path, cli, classes_file, image_folder, capsys):
    folder = _local_dir(tmp_path)
    art, head = tmp_path / "art", tmp_path / "head.npz"
    assert cli("fit", "--classes", classes_file(CLASSES), "--model", f"local-dir:{folder}", "--out", art)[0] == 0
    assert cli("export", art, "--out", head)[0] == 0
    moved = tmp_path / "moved"
    shutil.copytree(folder, moved)
    code, out, err = cli("classify", art, image_folder, "--model", f"local-dir:{moved}")  # a moved copy: same bytes
    assert code == 0, err
    save_file(_state(seed=1), str(folder / "open_clip_model.safetensors"))  # other weights under the recorded name
    for argv in (("classify", art, image_folder, "--top-k", 3), ("eval", art, "--data", image_folder)):
        code, out, err = cli(*argv)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert "are not the ones the artifact was fit with" in err and "sha256" in err
    code, out, err = _script(capsys, head, image_folder)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "sha256" in err, err
    code, out, err = cli("classify", art, image_folder, "--checkpoint", folder / "open_clip_model.safetensors")
    assert code == 2 and "holds its own weights; drop --checkpoint" in err


def test_hf_hub_weights_that_changed_are_refused(hf_cache, tmp_path, cli, classes_file, image_folder):  # noqa: F811
    cfg = json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": {}}).encode()
    _seed_repo(hf_cache, "svgen-test/tiny", {"open_clip_config.json": cfg,
                                             "open_clip_model.safetensors": _weights_bytes(_state(), tmp_path)})
    art = tmp_path / "art"
    assert cli("fit", "--classes", classes_file(CLASSES), "--model", "hf-hub:svgen-test/tiny", "--out", art)[0] == 0
    shutil.rmtree(hf_cache / "models--svgen-test--tiny")
    _seed_repo(hf_cache, "svgen-test/tiny", {"open_clip_config.json": cfg,
                                             "open_clip_model.safetensors": _weights_bytes(_state(seed=2), tmp_path)})
    code, out, err = cli("classify", art, image_folder, "--top-k", 3)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "sha256" in err, err
