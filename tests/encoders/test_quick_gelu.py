"""The MLP activation (GELU or QuickGELU) through every loading path, and where it is recorded.

OpenAI's weights were trained with QuickGELU; open_clip 3.x builds ``ViT-B-32`` with GELU even
for the ``openai`` tag and only warns. These tests load a random-weight model the ways users do
and assert the activation *module* that was built (random weights make either activation give
plausible numbers, so the numbers cannot tell). The pretrained-tag and ``hf-hub:`` paths read a
Hugging Face cache seeded here in the real layout (``models--ORG--NAME/{refs,blobs,snapshots}``)
with ``HF_HUB_OFFLINE=1``: the tag's own ``hf_hub`` repo from open_clip's table, with the
built-in ``ViT-B-32`` config swapped for the tiny one so the checkpoint is small. Everything
else — the tag lookup, the cache resolution, the checkpoint load — is open_clip's real code.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from svgen.encoders.clip import ClipEncoder

from svgen.encoders.activation import built_quick_gelu, swapped_activation

from svgen.encoders.identity import identity_key
from svgen.errors import SvgenError

from conftest import TINY_CFG

ROOT = Path(__file__).resolve().parents[2]


def _acts(model):
    """The class names of the text and image towers' first MLP activation."""
    return (type(model.transformer.resblocks[0].mlp.gelu).__name__,
            type(model.visual.transformer.resblocks[0].mlp.gelu).__name__)


def _expect(quick):
    name = "QuickGELU" if quick else "GELU"
    return (name, name)


def _state(seed=0):
    import open_clip

    torch.manual_seed(seed)
    return {k: v.contiguous() for k, v in open_clip.create_model("svgen-tiny").state_dict().items()}


def _seed_repo(cache: Path, repo_id: str, files: dict) -> Path:
    """Lay out ``repo_id`` in a Hugging Face cache as huggingface_hub does: blobs, refs/main, snapshot links."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snap), snap / name)
    return snap


def _weights_bytes(state, tmp_path) -> bytes:
    f = tmp_path / "w.safetensors"
    save_file(state, str(f))
    return f.read_bytes()


@pytest.fixture
def hf_cache(tmp_path, monkeypatch, tiny_model):
    """An empty HF cache (read by huggingface_hub at call time) and ViT-B-32[-quickgelu] sized like svgen-tiny."""
    import huggingface_hub.constants as hf_constants
    import open_clip.factory as factory

    cache = tmp_path / "hf-hub-cache"
    cache.mkdir()
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    # The built-in configs' own keys, at tiny sizes: ViT-B-32 has no quick_gelu key, its variant says True.
    monkeypatch.setitem(factory._MODEL_CONFIGS, "ViT-B-32", copy.deepcopy(TINY_CFG))
    monkeypatch.setitem(factory._MODEL_CONFIGS, "ViT-B-32-quickgelu", {**copy.deepcopy(TINY_CFG), "quick_gelu": True})
    return cache


def _seed_tag(cache, tmp_path, model="ViT-B-32", tag="openai", state=None):
    import open_clip

    hub = open_clip.get_pretrained_cfg(model, tag)["hf_hub"]
    assert hub.endswith("/")  # open_clip then asks for open_clip_model.safetensors first
    return _seed_repo(cache, hub.rstrip("/"), {"open_clip_model.safetensors": _weights_bytes(state or _state(), tmp_path)})


def _quickgelu_warnings(records):
    return [str(w.message) for w in records if "QuickGELU" in str(w.message)]


# ----------------------------------------------------------------------------- pretrained tags

def test_open_clip_alone_falls_into_the_trap(hf_cache, tmp_path):
    """The control: with this seeded cache, stock open_clip builds GELU for 'openai' and only warns."""
    import open_clip

    _seed_tag(hf_cache, tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        model = open_clip.create_model("ViT-B-32", pretrained="openai")
    assert _acts(model) == _expect(False)
    assert _quickgelu_warnings(rec)


@pytest.mark.parametrize("model, tag, quick", [
    ("ViT-B-32", "openai", True),             # the default: the tag says QuickGELU, the name does not
    ("ViT-B-32-quickgelu", "openai", True),
    ("ViT-B-32", "laion400m_e32", True),
    ("ViT-B-32", "laion2b_s34b_b79k", False),  # a GELU tag stays GELU
])
def test_tag_builds_the_tags_activation(hf_cache, tmp_path, model, tag, quick):
    state = _state(seed=3)
    _seed_tag(hf_cache, tmp_path, model, tag, state)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        enc = ClipEncoder(model, pretrained=tag)
    assert _acts(enc.model) == _expect(quick)
    assert enc.quick_gelu is quick and enc.identity()["quick_gelu"] is quick
    assert enc.identity()["pretrained"] == tag and enc.identity()["model"] == model
    assert not _quickgelu_warnings(rec)
    assert torch.equal(enc.model.text_projection, state["text_projection"])  # the cached weights were loaded


def test_tag_refuses_a_contradicting_override(hf_cache, tmp_path):
    _seed_tag(hf_cache, tmp_path)
    with pytest.raises(SvgenError, match="trained with QuickGELU; --no-quick-gelu would give wrong embeddings"):
        ClipEncoder("ViT-B-32", pretrained="openai", quick_gelu=False)
    assert ClipEncoder("ViT-B-32", pretrained="openai", quick_gelu=True).quick_gelu is True  # agreeing is fine


# ----------------------------------------------------------------------------- hf-hub: and local-dir:

@pytest.mark.parametrize("quick", [True, False])
def test_hf_hub_follows_its_config(hf_cache, tmp_path, quick):
    cfg = {"model_cfg": {**TINY_CFG, "quick_gelu": quick}, "preprocess_cfg": {}}
    _seed_repo(hf_cache, f"svgen-test/tiny-{quick}", {"open_clip_config.json": json.dumps(cfg).encode(),
                                                     "open_clip_model.safetensors": _weights_bytes(_state(), tmp_path)})
    enc = ClipEncoder(f"hf-hub:svgen-test/tiny-{quick}")
    assert _acts(enc.model) == _expect(quick) and enc.identity()["quick_gelu"] is quick
    flipped = ClipEncoder(f"hf-hub:svgen-test/tiny-{quick}", quick_gelu=not quick)  # an explicit override wins
    assert _acts(flipped.model) == _expect(not quick) and flipped.identity()["quick_gelu"] is (not quick)
    assert flipped.identity_key() != enc.identity_key()  # prompt caches never mix the two


@pytest.mark.parametrize("quick", [True, False, None])
def test_local_dir_follows_its_config(tmp_path, quick):
    folder = tmp_path / "local"
    folder.mkdir()
    model_cfg = dict(TINY_CFG) if quick is None else {**TINY_CFG, "quick_gelu": quick}
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": model_cfg, "preprocess_cfg": {}}))
    save_file(_state(), str(folder / "open_clip_model.safetensors"))
    enc = ClipEncoder(f"local-dir:{folder}")
    assert _acts(enc.model) == _expect(bool(quick)) and enc.identity()["quick_gelu"] is bool(quick)


# ----------------------------------------------------------------------------- checkpoints and configs

def _config(tmp_path, name, **extra):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({**TINY_CFG, **extra}))
    return str(path)


@pytest.mark.parametrize("name, extra, override, quick", [
    ("svgen-tiny", {}, None, False),                              # no variant, nothing says: GELU, no warning
    ("svgen-tiny", {}, True, True),                               # --quick-gelu
    ("svgen-tiny-q1-quickgelu", {"quick_gelu": True}, None, True),  # the config says so
    ("svgen-tiny-q2-quickgelu", {}, None, True),                  # the -quickgelu name says so
    ("svgen-tiny-q3-quickgelu", {"quick_gelu": True}, False, False),  # --no-quick-gelu wins over both
])
def test_checkpoint_with_a_model_config(tmp_path, tiny_model, caplog, name, extra, override, quick):
    with caplog.at_level(logging.WARNING, logger="svgen"):
        enc = ClipEncoder(_config(tmp_path, name, **extra), checkpoint=tiny_model["safetensors"], quick_gelu=override)
    assert _acts(enc.model) == _expect(quick) and enc.identity()["quick_gelu"] is quick
    assert enc.identity()["checkpoint"] == "tiny.safetensors"
    assert not [r for r in caplog.records if "QuickGELU" in r.getMessage()]


def test_bare_checkpoint_into_an_architecture_with_a_variant_warns_once(hf_cache, tiny_model, caplog, monkeypatch):
    import svgen.encoders.activation as activation

    monkeypatch.setattr(activation, "_warned_bare_checkpoint", set())
    with caplog.at_level(logging.WARNING, logger="svgen"):
        first = ClipEncoder("ViT-B-32", checkpoint=tiny_model["safetensors"])
        ClipEncoder("ViT-B-32", checkpoint=tiny_model["pt"])
    lines = [r.getMessage() for r in caplog.records if "QuickGELU" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    for choice in ("--quick-gelu", "--no-quick-gelu", "ViT-B-32-quickgelu"):
        assert choice in lines[0]
    assert _acts(first.model) == _expect(False) and first.identity()["quick_gelu"] is False
    caplog.clear()
    monkeypatch.setattr(activation, "_warned_bare_checkpoint", set())
    with caplog.at_level(logging.WARNING, logger="svgen"):
        chosen = ClipEncoder("ViT-B-32", checkpoint=tiny_model["safetensors"], quick_gelu=True)
        variant = ClipEncoder("ViT-B-32-quickgelu", checkpoint=tiny_model["safetensors"])
    assert not caplog.records  # something said which: no warning
    assert _acts(chosen.model) == _acts(variant.model) == _expect(True)


def test_identity_key_carries_the_activation():
    base = {"model": "ViT-B-32", "pretrained": None, "checkpoint_sha256": "ab" * 32}
    keys = {identity_key({**base, "quick_gelu": q}) for q in (True, False, None)}
    assert len(keys) == 3
    assert identity_key(base) == identity_key({**base, "quick_gelu": None})  # older identities: unchanged key


def test_built_activation_is_read_from_the_modules(tiny_model):
    enc = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])
    assert built_quick_gelu(enc.model) is False
    with swapped_activation(enc.model):
        assert built_quick_gelu(enc.model) is True and _acts(enc.model) == _expect(True)
    assert built_quick_gelu(enc.model) is False  # restored
    wrapped = ClipEncoder.from_model(enc.model, enc.tokenizer, enc.preprocess, name="mine")
    assert wrapped.identity()["quick_gelu"] is False


# ----------------------------------------------------------------------------- the CLI and artifacts

def _fit(cli, classes_file, out, *encoder_args):
    code, stdout, err = cli("fit", "--classes", classes_file(["cat", "dog", "car"]), "--out", out,
                            "--steps", 3, "--ridge", 10, *encoder_args)
    assert code == 0, err
    return json.loads((Path(out) / "svgen.json").read_text())["encoder"], err


@pytest.fixture
def built(monkeypatch):
    """Every ClipEncoder the commands build, in order."""
    import svgen.encoders.clip as encoders

    made = []

    class Spy(encoders.ClipEncoder):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            made.append(self)

    monkeypatch.setattr(encoders, "ClipEncoder", Spy)
    return made


def test_done_when_default_fit_builds_quickgelu_for_openai(hf_cache, tmp_path, cli, classes_file, built):
    """`svgen fit --classes …` (ViT-B-32, openai by default) with the cache seeded: QuickGELU, no warning."""
    _seed_tag(hf_cache, tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        enc, err = _fit(cli, classes_file, tmp_path / "art")
    assert len(built) == 1 and built[0].model_name == "ViT-B-32" and built[0].pretrained == "openai"
    assert _acts(built[0].model) == _expect(True)
    assert enc["quick_gelu"] is True and enc["model"] == "ViT-B-32" and enc["pretrained"] == "openai"
    assert not _quickgelu_warnings(rec) and "QuickGELU" not in err and "warn" not in err.lower()


def test_done_when_no_warning_printed_by_the_real_command(hf_cache, tmp_path):
    """The same in a fresh process, as a user runs it: nothing about QuickGELU on stderr."""
    _seed_tag(hf_cache, tmp_path)
    # the fresh process has no pytest fixture: it forbids the network itself, as every test does
    script = ("import sys, copy, open_clip.factory as f; sys.path.insert(0, sys.argv.pop(1)); "
              "from netguard import forbid_network; forbid_network(); from conftest import TINY_CFG; "
              "f._MODEL_CONFIGS['ViT-B-32'] = copy.deepcopy(TINY_CFG); "
              "from svgen.cli import main; sys.exit(main())")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hf_cache),
           "SVGEN_CACHE_DIR": str(tmp_path / "svgen-cache"), "PYTHONWARNINGS": "always"}
    classes = tmp_path / "c.txt"
    classes.write_text("cat\ndog\n")
    proc = subprocess.run([sys.executable, "-c", script, str(ROOT / "tests"), "fit", "--classes", str(classes),
                           "--steps", "2", "--ridge", "10", "--out", str(tmp_path / "art")],
                          env=env, capture_output=True, text=True, timeout=300)  # a guard, not a timing
    assert proc.returncode == 0, proc.stderr
    assert "QuickGELU" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "art" / "svgen.json").read_text())["encoder"]["quick_gelu"] is True


def _logged(caplog, text):
    # the CLI's handler prints these as "svgen: WARNING: ..."; in-process pytest holds the root logger
    return [r.getMessage() for r in caplog.records if text in r.getMessage() and r.levelno == logging.WARNING]


def test_cli_bare_checkpoint_warns_in_one_line(hf_cache, tmp_path, cli, classes_file, tiny_model, monkeypatch, caplog):
    import svgen.encoders.activation as activation

    monkeypatch.setattr(activation, "_warned_bare_checkpoint", set())
    enc, err = _fit(cli, classes_file, tmp_path / "a", "--model", "ViT-B-32", "--checkpoint", tiny_model["safetensors"])
    lines = _logged(caplog, "QuickGELU")
    assert len(lines) == 1 and "\n" not in lines[0] and "--quick-gelu" in lines[0] and "--no-quick-gelu" in lines[0]
    assert enc["quick_gelu"] is False
    caplog.clear()
    monkeypatch.setattr(activation, "_warned_bare_checkpoint", set())
    enc, err = _fit(cli, classes_file, tmp_path / "b", "--model", "ViT-B-32", "--checkpoint", tiny_model["safetensors"],
                    "--quick-gelu")
    assert enc["quick_gelu"] is True and not _logged(caplog, "QuickGELU")


def test_classify_uses_and_enforces_the_recorded_activation(tmp_path, cli, classes_file, tiny_model, shared_data,
                                                            monkeypatch, built):
    import svgen.encoders.clip as encoders

    image = sorted((shared_data / "images-30class").glob("*.jpg"))[0]
    art = tmp_path / "art"
    ckpt = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    enc, _ = _fit(cli, classes_file, art, *ckpt, "--quick-gelu")
    assert enc["quick_gelu"] is True
    code, out, err = cli("classify", art, image, *ckpt)  # no flag: the artifact's QuickGELU
    assert code == 0, err
    assert _acts(built[-1].model) == _expect(True)

    code, out, err = cli("classify", art, image, *ckpt, "--no-quick-gelu")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "--no-quick-gelu contradicts the artifact" in err and "QuickGELU" in err

    # an artifact that records GELU while the source now builds QuickGELU: refused in one line
    meta = json.loads((art / "svgen.json").read_text())
    meta["encoder"]["quick_gelu"] = False
    (art / "svgen.json").write_text(json.dumps(meta))
    monkeypatch.setattr(encoders, "decide_quick_gelu", lambda *a, **k: (True, "a changed tag table"))
    code, out, err = cli("classify", art, image, *ckpt)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "built with GELU but this one with QuickGELU" in err


def test_older_artifacts_without_the_field_keep_working(hf_cache, tmp_path, cli, classes_file, shared_data,
                                                        tiny_model, caplog):
    """No quick_gelu recorded (fit before svgen recorded it): classify and add-classes work; a warning says
    to refit when the activation built today differs from what open_clip built then (GELU for ViT-B-32 +
    openai); a checkpoint artifact whose activation was never in doubt gets no warning."""
    _seed_tag(hf_cache, tmp_path)
    image = sorted((shared_data / "images-30class").glob("*.jpg"))[0]
    ckpt = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    for name, extra in (("tag", []), ("ckpt", ckpt)):
        art = tmp_path / name
        _fit(cli, classes_file, art, *extra)
        meta = json.loads((art / "svgen.json").read_text())
        del meta["encoder"]["quick_gelu"]
        (art / "svgen.json").write_text(json.dumps(meta))
        caplog.clear()
        code, out, err = cli("classify", art, image, *extra)
        assert code == 0 and out.count("\n") == 2, err
        warned = _logged(caplog, "records no activation")
        assert len(warned) == (1 if name == "tag" else 0), err
        if warned:
            assert "GELU" in warned[0] and "QuickGELU" in warned[0] and "refit" in warned[0]
        code, out, err = cli("add-classes", art, "--classes", classes_file(["bird"], "more.txt"), *extra)
        assert code == 0, err


# ----------------------------------------------------------------------------- messages and the deploy script

def test_offline_message_recommends_quickgelu_for_openai_weights():
    from svgen.encoders import hub

    error = hub.unavailable("ViT-B-32 weights 'openai'", "offline", "ViT-B-32", "openai")
    assert "--model ViT-B-32 --checkpoint FILE --quick-gelu" in error.cli_message   # what the CLI prints
    assert "ClipEncoder('ViT-B-32', checkpoint=FILE, quick_gelu=True)" in str(error)   # what Python callers read
    other = hub.unavailable("ViT-B-32 weights 'laion2b_s34b_b79k'", "offline", "ViT-B-32", "laion2b_s34b_b79k")
    assert "--quick-gelu" not in other.cli_message and "--model ViT-B-32 --checkpoint FILE" in other.cli_message
    assert "quick_gelu" not in str(other)
    assert "--quick-gelu" not in hub.unavailable("ViT-B-32-quickgelu weights", "x", "ViT-B-32-quickgelu", "openai").cli_message


def test_deploy_script_builds_the_recorded_activation(hf_cache, tmp_path, tiny_model):
    import argparse
    import runpy

    script = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))
    _seed_tag(hf_cache, tmp_path)
    args = argparse.Namespace(model=None, pretrained=None, checkpoint=None, device="cpu")
    model, _ = script["load_model"](args, {"model": "ViT-B-32", "pretrained": "openai"})  # older head: the tag's
    assert _acts(model) == _expect(True)
    args.checkpoint = tiny_model["safetensors"]
    recorded = {"model": "svgen-tiny", "checkpoint_sha256": hashlib.sha256(Path(args.checkpoint).read_bytes()).hexdigest()}
    args.model = tiny_model["config"]
    for quick in (True, False):
        model, _ = script["load_model"](args, {**recorded, "quick_gelu": quick})
        assert _acts(model) == _expect(quick)
