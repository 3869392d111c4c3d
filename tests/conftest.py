"""Shared fixtures. Nothing here touches the network.

* ``tiny_model``: a small open_clip architecture with random weights, saved as a config JSON +
  safetensors checkpoint, a torch ``.pt`` checkpoint and a ``local-dir:`` folder, so tests load
  it through the same paths users do.
* ``shared_data``: ``../shared/data`` (real CLIP embeddings and photographs); skips when absent.
* ``cli``: run ``svgen`` in-process and capture (exit code, stdout, stderr).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
if str(Path(__file__).resolve().parent) not in sys.path:   # `from conftest import …` in tests/<layer>/ files
    sys.path.insert(0, str(Path(__file__).resolve().parent))
SHARED_DATA = ROOT.parent / "shared" / "data"

from netguard import forbid_network  # noqa: E402  (tests/ is on sys.path from here on)

TINY_CFG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 16},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}


# ----------------------------------------------------------------------------- helpers the test files share

def strict_json(text):
    """json.loads that refuses NaN/Infinity (RFC 8259), as jq and every other strict parser do."""
    def bad(constant):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=bad)


def one_line_error(code, out, err, *expected):
    """A CLI result ``(code, out, err)`` that is one error line with ``expected`` words, exit 2, no stdout."""
    assert code == 2, (code, err)
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in expected:
        assert word in lines[0], (word, lines[0])
    return lines[0]



def one_line(code, err, *expected):
    """A CLI error ``(code, err)``: exit 2 and one stderr line with ``expected`` words (stdout not checked)."""
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    for e in expected:
        assert e in lines[0], lines[0]
    return lines[0]


def private_copy(files, tmp_path, monkeypatch):
    """A private copy of the inputs in ``files`` (and of their artifact) in ``tmp_path``; the test runs inside it."""
    copy_into(files, tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def small_input_fixtures(names, dim: int, tag: str):
    """The ``files`` (module scope: :func:`write_small_inputs` with 3 templates and 12 rows) and ``work`` (a
    :func:`private_copy` of them per test, which runs inside it) fixtures of a module: ``files, work = …``."""
    @pytest.fixture(scope="module")
    def files(tmp_path_factory):
        return write_small_inputs(tmp_path_factory.mktemp(tag), names, dim, templates=3, rows=12)

    @pytest.fixture
    def work(files, tmp_path, monkeypatch):
        return private_copy(files, tmp_path, monkeypatch)

    return files, work

# ----------------------------------------------------------------------------- markers (the quick subset)

# Whole files whose tests start Ray, run the README's sessions, or fit and score real data sets.
SLOW_FILES = {"test_ray_engine.py", "test_readme.py", "test_accuracy_real.py", "test_classify_eval_export_real.py",
              "test_bench_calibration.py"}


def pytest_collection_modifyitems(config, items):
    """Markers assigned here, by file and fixture, so test files need no decorators:

    * ``real_data``: the test uses ``../shared/data`` (the ``shared_data`` fixture, directly or through
      another fixture); it skips where the data are absent;
    * ``slow``: a ``real_data`` test, or one in :data:`SLOW_FILES`.

    ``pytest -m "not slow"`` is the quick subset (the README names it); CI (``.ci/run``) runs everything.
    """
    for item in items:
        real = "shared_data" in getattr(item, "fixturenames", ())
        if real:
            item.add_marker(pytest.mark.real_data)
        if real or Path(str(item.fspath)).name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _no_network(monkeypatch):
    """Tests never reach the network (tests that name a downloadable tag such as 'openai' must find it in a seeded
    cache, never on a hub)."""
    forbid_network(monkeypatch.setattr)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(tmp_path / "svgen-cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Paths of a random-weight open_clip model: config, .safetensors, .pt and a local-dir folder."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


def build_tiny_model(root) -> dict:
    """Write the tiny random-weight model (seed 0: the same bytes every time) under ``root``.

    Also used by ``scripts/readme_sessions.py``, whose README sessions run on ``tiny/``.
    """
    import open_clip
    import torch
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    config = root / "svgen-tiny.json"
    config.write_text(json.dumps(TINY_CFG))
    open_clip.add_model_config(str(config))
    torch.manual_seed(0)
    model = open_clip.create_model("svgen-tiny")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(root / "tiny.safetensors"))
    torch.save(state, root / "tiny.pt")
    local = root / "local"
    local.mkdir(exist_ok=True)
    (local / "open_clip_config.json").write_text(json.dumps({"model_cfg": TINY_CFG, "preprocess_cfg": {}}))
    save_file(state, str(local / "open_clip_model.safetensors"))
    return {
        "config": str(config),
        "safetensors": str(root / "tiny.safetensors"),
        "pt": str(root / "tiny.pt"),
        "local_dir": f"local-dir:{local}",
        "dim": TINY_CFG["embed_dim"],
    }


@pytest.fixture(scope="session")
def shared_data():
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is absent")
    return SHARED_DATA


@pytest.fixture
def cli(capsys):
    """Run the CLI in-process: ``code, out, err = cli("fit", "--classes", ...)``."""
    from svgen.cli import main

    def run(*argv):
        capsys.readouterr()
        code = main([str(a) for a in argv])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    return run


@pytest.fixture
def refused_cleanly(cli):
    """``refused_cleanly(files, command, args, msg)``: ``svgen adapt`` (on a zero-shot artifact fit from
    ``files/P.npy`` first) or ``svgen fit`` with the bad ``args`` (names ending in .npy are taken from
    ``files``) exits 2 with one line containing ``msg``, and writes nothing — no artifact, no temp folder."""
    def check(files, command, args, msg):
        args = tuple(files / a if a.endswith(".npy") else a for a in args)
        if command == "adapt":
            assert cli("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
                       "--steps", "3", "--out", files / "zs.svgen")[0] == 0
            argv = ("adapt", files / "zs.svgen", *args, "--out", files / "new.svgen")
        else:
            argv = ("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
                    "--steps", "3", *args, "--out", files / "new.svgen")
        code, out, err = cli(*argv)
        assert code == 2 and msg in err and len(err.strip().splitlines()) == 1, err
        assert not (files / "new.svgen").exists()
        assert not [p for p in files.iterdir() if p.name.startswith(".new.svgen")]

    return check


@pytest.fixture
def classes_file(tmp_path):
    def make(names, name="classes.txt"):
        p = tmp_path / name
        p.write_text("\n".join(names) + "\n", encoding="utf-8")
        return p

    return make


# ----------------------------------------------------------------------------- benchmark scripts

def load_script(name: str):
    """``benchmarks/<name>.py`` imported as ``benchmarks.<name>`` (the package the benchmarks are run from with
    ``python -m``), once, so a benchmark that imports another (``bench_calibration`` imports ``bench_common``) gets
    the same module object a test patches."""
    import importlib
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"benchmarks.{name}")


def write_inputs(folder, prototypes, **arrays) -> Path:
    """A folder of CLI inputs: ``P.npy`` (the prototypes), ``classes.txt`` (``c0``, ``c1``, … one per prototype) and
    ``NAME.npy`` for every other array given; returns the folder."""
    import numpy as np

    folder = Path(folder)
    np.save(folder / "P.npy", prototypes)
    (folder / "classes.txt").write_text("".join(f"c{i}\n" for i in range(len(prototypes))))
    for name, array in arrays.items():
        np.save(folder / f"{name}.npy", array)
    return folder


def write_coop_toy(root, name, C=4, D=16, splits=(("train16", 16), ("val", 10)), noise=1.0, centre_scale=1.0,
                   seed=0) -> dict:
    """A small synthetic CoOp folder ``root/name`` (``<split>_features.npy`` / ``<split>_labels.npy``, ``n``
    rows per class around C random centres); returns ``{split: (X, y)}``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    d = Path(root) / name
    d.mkdir(parents=True)
    centres = centre_scale * rng.normal(size=(C, D))
    out = {}
    for split, n in splits:
        y = np.repeat(np.arange(C), n)
        X = (centres[y] + noise * rng.normal(size=(len(y), D))).astype(np.float32)
        np.save(d / f"{split}_features.npy", X)
        np.save(d / f"{split}_labels.npy", y)
        out[split] = (X, y)
    return out


def write_textlike_val_toy(root, name, C, n_val, D=16, spread=1.5):
    """:func:`write_coop_toy` with only a ``val`` split (centres ×2) and ``textlike_prototypes.npy``: each class's
    val mean moved by ``spread`` × Gaussian noise, a prior that is informative but off; returns ``(X, y, P)``."""
    import numpy as np

    X, y = write_coop_toy(root, name, C=C, D=D, splits=(("val", n_val),), centre_scale=2.0)["val"]
    P = np.stack([X[y == c].mean(0) for c in range(C)]) + spread * np.random.default_rng(1).normal(size=(C, D))
    np.save(Path(root) / name / "textlike_prototypes.npy", P.astype(np.float32))
    return X, y, P


# ----------------------------------------------------------------------------- reliability tests (issue 24)

def write_png_shots(root, names, per_class: int = 3, step: int = 70, seed: int = 0) -> Path:
    """``root``/classes.txt (``names``) and ``root``/shots/<name>/<i>.png: ``per_class`` small noisy images per class,
    class c around the grey level 60 + ``step``·c; returns the shots folder."""
    import numpy as np
    from PIL import Image

    root = Path(root)
    (root / "classes.txt").write_text("\n".join(names) + "\n")
    rng = np.random.default_rng(seed)
    for c, name in enumerate(names):
        folder = root / "shots" / name.replace(" ", "_")
        folder.mkdir(parents=True)
        for i in range(per_class):
            img = np.clip(rng.normal(60 + step * c, 30, size=(40, 40, 3)), 0, 255).astype(np.uint8)
            Image.fromarray(img).save(folder / f"{i}.png")
    return root / "shots"


def file_tree(folder) -> dict:
    """Every file under ``folder`` with its bytes (hidden ones too): 'nothing written' means equal trees."""
    folder = Path(folder)
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def write_small_inputs(root, names, dim: int, templates: int = 2, rows: int = 8, new=("new a", "new b")):
    """``root``/P.npy (C×T×D prototypes), classes.txt, F.npy + y.npy (N features and labels), P2.npy +
    new.txt (classes to add) and a.svgen (a zero-shot artifact fit from P.npy, K = 2)."""
    import numpy as np

    from svgen import SVGClassifier

    root = Path(root)
    rng = np.random.default_rng(0)
    np.save(root / "P.npy", rng.normal(size=(len(names), templates, dim)).astype(np.float32))
    (root / "classes.txt").write_text("\n".join(names) + "\n")
    np.save(root / "F.npy", rng.normal(size=(rows, dim)).astype(np.float32))
    np.save(root / "y.npy", np.arange(rows) % len(names))
    np.save(root / "P2.npy", rng.normal(size=(len(new), templates, dim)).astype(np.float32))
    (root / "new.txt").write_text("\n".join(new) + "\n")
    SVGClassifier(n_support=2).fit(np.load(root / "P.npy"), classes=list(names)).save(root / "a.svgen")
    return root


def copy_into(source, dest) -> None:
    """Copy every file and folder of ``source`` into ``dest``."""
    import shutil

    for p in Path(source).iterdir():
        (shutil.copytree if p.is_dir() else shutil.copy)(p, Path(dest) / p.name)


# ----------------------------------------------------------------------------- real-data artifacts shared by modules
# (the CLI's real-data tests and the Ray engine's: one module-scoped artifact per module)

@pytest.fixture(scope="module")
def lvis(shared_data, tmp_path_factory):
    from svgen.cli import main

    d = shared_data / "clip-vit-b32"
    if not (d / "lvis_dev_image_features.npy").is_file():
        pytest.skip("LVIS CLIP embeddings are absent")
    art = tmp_path_factory.mktemp("lvis") / "lvis.svgen"
    code = main(["-q", "fit", "--prototypes", str(d / "lvis_v1_clip_a+cname.npy"), "--classes",
                 str(d / "lvis_classes.txt"), "-K", "2", "--steps", "2", "--ridge", "10", "--out", str(art)])
    assert code == 0
    return {"art": art, "feats": d / "lvis_dev_image_features.npy", "labels": d / "lvis_dev_labels.npy",
            "protos": d / "lvis_v1_clip_a+cname.npy",
            "classes": (d / "lvis_classes.txt").read_text(encoding="utf-8").splitlines()}


@pytest.fixture(scope="module")
def jpegs(shared_data, tiny_model, tmp_path_factory):
    from svgen.cli import main

    images = shared_data / "images-30class"
    if not (images / "labels.csv").is_file():
        pytest.skip("images-30class is absent")
    root = tmp_path_factory.mktemp("jpegs")
    labels = [ln.split(",") for ln in (images / "labels.csv").read_text().splitlines() if ln.strip()]
    classes = sorted({c for _, c in labels})
    (root / "classes.txt").write_text("\n".join(classes) + "\n")
    enc = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    art = root / "tiny.svgen"
    assert main(["-q", "fit", "--classes", str(root / "classes.txt"), *enc, "--steps", "5", "--ridge", "10",
                 "--out", str(art)]) == 0
    return {"root": root, "images": images, "labels": labels, "classes": classes, "art": art, "enc": enc}


def oxford_pets_shots(shared_data, per_class: int = 6):
    """``P, X, y``: oxford_pets' text-like prototypes and ``per_class`` of its validation images per class (a seeded
    draw), for the scikit-learn tests on real features; skips where they are absent."""
    import numpy as np

    d = shared_data / "clip-vit-b32" / "coop-fewshot" / "oxford_pets"
    if not (d / "textlike_prototypes.npy").is_file():
        pytest.skip("no oxford_pets features")
    P = np.load(d / "textlike_prototypes.npy")
    X, y = np.load(d / "val_features.npy").astype(np.float32), np.load(d / "val_labels.npy")
    rng = np.random.default_rng(0)
    keep = np.concatenate([rng.choice(np.flatnonzero(y == c), per_class, replace=False) for c in range(P.shape[0])])
    return P, X[keep], y[keep]
