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

from conftest import file_tree, one_line_error


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


# ----------------------------------------------------------------------------- item 12: one --device check

@pytest.fixture(scope="module")
def small(tmp_path_factory):
    from conftest import write_small_inputs

    return write_small_inputs(tmp_path_factory.mktemp("small"), ["a", "b", "c"], 32)


def _every_command(small, tiny_model, tmp_path):
    """One invocation of each command that takes --device, on inputs that are fine (the device is all that is
    wrong); none of them needs an encoder except through --device."""
    enc = ("--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"])
    art, feats, labels = small / "a.svgen", small / "F.npy", small / "y.npy"
    return {
        "fit": ("fit", "--classes", small / "classes.txt", *enc, "--out", tmp_path / "n.svgen"),
        "fit --prototypes": ("fit", "--prototypes", small / "P.npy", "--classes", small / "classes.txt",
                             "--out", tmp_path / "n.svgen"),
        "classify --features": ("classify", art, "--features", feats),
        "classify images": ("classify", art, small / "F.npy", *enc),
        "eval --features": ("eval", art, "--features", feats, "--labels", labels),
        "add-classes": ("add-classes", art, "--classes", small / "new.txt", "--prototypes", small / "P2.npy"),
        "adapt": ("adapt", art, "--shot-features", feats, "--shot-labels", labels, "--out", tmp_path / "o.svgen"),
        "check-encoder": ("check-encoder", *enc),
    }


def _no_gpu(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


@pytest.mark.parametrize("device, words", [
    ("cuda:99999999999999999999", ("--device cuda:99999999999999999999", "no CUDA device is available",
                                   "--device cpu")),
    ("cuda:3", ("--device cuda:3", "no CUDA device is available", "--device cpu")),
    ("cuda", ("--device cuda", "no CUDA device is available", "--device cpu")),
    ("mps", ("--device mps", "MPS", "not available", "--device cpu")),
    ("gpu", ("--device 'gpu' is not a device", "auto, cpu, cuda, cuda:N or mps")),
])
def test_every_command_checks_the_device_alike_without_a_gpu(small, tiny_model, tmp_path, cli, monkeypatch,
                                                              device, words):
    """Without CUDA or MPS every command refuses the same device with the same line, before any work (``eval
    --features --device cuda:3`` was accepted while ``fit`` refused it; ``classify --device
    cuda:99999999999999999999`` was an internal RuntimeError; ``--device mps`` said to pass local weights)."""
    _no_gpu(monkeypatch)
    before, lines = file_tree(small), set()
    for name, argv in _every_command(small, tiny_model, tmp_path).items():
        line = one_line_error(*cli(*argv, "--device", device), *words)
        assert "internal error" not in line and "local weights" not in line, (name, line)
        lines.add(line.split(": error: ", 1)[1])
    assert len(lines) == 1, lines
    assert not list(tmp_path.iterdir()) and file_tree(small) == before   # nothing written, nothing changed


def test_a_cuda_index_past_the_last_device_is_one_line(small, tiny_model, tmp_path, cli, monkeypatch):
    """With CUDA (simulated: one device) an index it does not have is one line naming the devices there are."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for index in ("1", "99999999999999999999"):
        for argv in _every_command(small, tiny_model, tmp_path).values():
            one_line_error(*cli(*argv, "--device", f"cuda:{index}"),
                           f"--device cuda:{index} names CUDA device {index}, but this machine has 1 (cuda:0)")


def test_joining_a_ray_cluster_checks_only_the_device_name(monkeypatch):
    """With --address the actors run on the cluster's nodes, whose devices are theirs: a CUDA device this machine
    lacks is not refused here, a name that is no device still is."""
    from argparse import Namespace

    from svgen.commands._common import check_device
    from svgen.errors import SvgenError

    _no_gpu(monkeypatch)
    check_device(Namespace(device="cuda:3", address="auto"))
    with pytest.raises(SvgenError, match="no CUDA device"):
        check_device(Namespace(device="cuda:3", address=None))
    with pytest.raises(SvgenError, match="is not a device"):
        check_device(Namespace(device="gpu", address="auto"))


def test_the_library_checks_the_device_with_the_same_rule(monkeypatch):
    import torch

    from svgen.encoders.runtime import resolve_device
    from svgen.errors import SvgenError

    _no_gpu(monkeypatch)
    for device in ("cuda:99999999999999999999", "mps", "gpu", torch.device("cuda", 2)):
        with pytest.raises(SvgenError) as e:
            resolve_device(device)
        assert "device=" in str(e.value) and e.value.cli_message.startswith("--device")
    assert resolve_device("cpu") == torch.device("cpu") == resolve_device("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(SvgenError, match="has 2 \\(cuda:0 to cuda:1\\)"):
        resolve_device(torch.device("cuda", 2))


def test_a_checkpoint_that_fails_to_load_is_not_told_to_pass_local_weights(tiny_model, monkeypatch):
    """Local weights were passed: a failure while open_clip builds the model names the checkpoint and the device."""
    import open_clip

    from svgen.encoders.clip import ClipEncoder
    from svgen.errors import SvgenError

    def fails(*a, **k):
        raise RuntimeError("PyTorch is not linked with support for mps devices")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", fails)
    with pytest.raises(SvgenError) as e:
        ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"], device="cpu")
    assert "local weights" not in str(e.value) and tiny_model["safetensors"] in str(e.value)
    assert "on cpu: PyTorch is not linked" in str(e.value)


# ----------------------------------------------------------------------------- item 17: torch and torchvision

class _BrokenTorchvision:
    """A meta-path finder under which importing torchvision (and so open_clip, which imports it) fails as it does
    with a torchvision built for another torch."""

    def __init__(self, message):
        self.message = message

    def find_spec(self, name, path=None, target=None):
        import importlib.util

        if name.split(".")[0] in ("torchvision", "open_clip"):
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise RuntimeError(self.message)


@pytest.fixture(params=["operator torchvision::nms does not exist",
                        "partially initialized module 'torchvision' has no attribute 'extension' (most likely due "
                        "to a circular import)"])
def broken_torchvision(request, monkeypatch):
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] in ("torchvision", "open_clip")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_BrokenTorchvision(request.param), *sys.meta_path])
    return request.param


def _pair_words():
    from importlib.metadata import version

    return (f"torch {version('torch')} and torchvision {version('torchvision')} do not match",
            "pip install --force-reinstall torch torchvision --index-url https://download.pytorch.org/whl/cpu")


def test_a_torchvision_built_for_another_torch_is_one_line(broken_torchvision, small, tiny_model, tmp_path, cli):
    from svgen.encoders.clip import ClipEncoder
    from svgen.errors import SvgenError

    with pytest.raises(SvgenError) as e:
        ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])
    assert all(w in str(e.value) for w in _pair_words()) and broken_torchvision[:40] in str(e.value)
    line = one_line_error(*cli("fit", "--classes", small / "classes.txt", "--model", tiny_model["config"],
                               "--checkpoint", tiny_model["safetensors"], "--out", tmp_path / "n.svgen"),
                          *_pair_words())
    assert "internal error" not in line and not (tmp_path / "n.svgen").exists()


def test_the_cli_names_the_pair_wherever_torchvision_is_first_imported(broken_torchvision, small, cli, monkeypatch):
    """Any command, any import site (here: eval's scoring, made to import torchvision)."""
    import svgen.commands.eval as eval_command

    def imports_torchvision(*a, **k):
        import torchvision  # noqa: F401

    monkeypatch.setattr(eval_command, "run", imports_torchvision)   # cli.main builds its parser (binds run) anew
    line = one_line_error(*cli("eval", small / "a.svgen", "--features", small / "F.npy", "--labels", small / "y.npy"),
                          *_pair_words())
    assert "internal error" not in line


def test_other_import_failures_are_not_called_a_torch_mismatch():
    from svgen.encoders.install import torch_pair_error

    assert torch_pair_error(RuntimeError("CUDA out of memory")) is None
    assert torch_pair_error(ImportError("No module named 'open_clip'")) is None
    assert torch_pair_error(ValueError("operator torchvision::nms does not exist")) is None


# ----------------------------------------------------------------------------- item 18: smaller usability fixes

def test_a_npy_given_as_an_image_asks_for_features(small, cli, tmp_path):
    """``classify ART feats.npy``: not "which model embeds images" but the option that was meant."""
    for argv in (("classify", small / "a.svgen", small / "F.npy"),
                 ("classify", small / "a.svgen", small / "F.npy", "--engine", "ray")):
        one_line_error(*cli(*argv), "F.npy is a .npy file, not an image", f"did you mean --features {small / 'F.npy'}?")
    folder = tmp_path / "photos.npy"   # a folder named so is a folder of images, not embeddings
    folder.mkdir()
    line = one_line_error(*cli("classify", small / "a.svgen", folder))
    assert "--features" not in line
    code, out, err = cli("classify", small / "a.svgen", "--features", small / "F.npy")
    assert code == 0 and len(out.splitlines()) == 1 + 8, err   # a header and F.npy's 8 rows


def test_open_clips_no_pretrained_notice_is_not_shown_for_a_checkpoint(small, tiny_model, tmp_path, cli, caplog,
                                                                        monkeypatch):
    """open_clip says "No pretrained weights loaded … initialized randomly" about its pretrained tags; with
    --checkpoint (loaded strictly, or an error) that line reads as if the checkpoint were ignored."""
    import logging

    import open_clip

    from svgen.encoders.clip import ClipEncoder

    real = open_clip.create_model_and_transforms

    def notices(model, *a, **k):   # an open_clip that logs the notice whatever it loads (as some versions do)
        logging.warning(f"No pretrained weights loaded for model '{model}'. Model initialized randomly.")
        return real(model, *a, **k)

    monkeypatch.setattr(open_clip, "create_model_and_transforms", notices)
    caplog.set_level(logging.INFO)
    enc = ClipEncoder(tiny_model["config"], checkpoint=tiny_model["safetensors"])
    assert "No pretrained weights loaded" not in caplog.text
    assert f"weights: {tiny_model['safetensors']}" in caplog.text and enc.checkpoint_sha256[:12] in caplog.text
    code, out, err = cli("fit", "--classes", small / "classes.txt", "--model", tiny_model["config"], "--checkpoint",
                         tiny_model["safetensors"], "--steps", "2", "--out", tmp_path / "n.svgen")
    assert code == 0 and "No pretrained" not in err and "No pretrained" not in caplog.text, err
    # without a checkpoint the notice is open_clip's to give (the filter is scoped to a checkpoint's load)
    from svgen.encoders.clip import quiet_about_tags

    caplog.clear()
    with quiet_about_tags(False):
        logging.warning("No pretrained weights loaded for model 'x'. Model initialized randomly.")
    with quiet_about_tags(True):
        logging.warning("No pretrained weights loaded for model 'y'. Model initialized randomly.")
    logging.warning("No pretrained weights loaded for model 'z'. Model initialized randomly.")
    assert "model 'x'" in caplog.text and "model 'y'" not in caplog.text and "model 'z'" in caplog.text


def test_adapt_help_is_short_and_points_to_the_usage_guide(capsys, monkeypatch):
    """``adapt --help`` was a 24-line paragraph (and two more for the shots and pool groups): now a few structured
    lines, every option still listed, the details in the docs/usage.md sections it names."""
    import re

    from svgen.cli import main

    from conftest import ROOT

    monkeypatch.setenv("COLUMNS", "100")
    with pytest.raises(SystemExit):
        main(["adapt", "--help"])
    text = capsys.readouterr().out
    description = text.split("\n\n")[1:text.split("\n\n").index(next(p for p in text.split("\n\n")
                                                                     if p.startswith("positional arguments")))]
    assert sum(len(p.splitlines()) for p in description) <= 14, description
    assert all(len(line) <= 100 for line in text.splitlines())
    for flag in ("--shots", "--shot-features", "--shot-labels", "--unlabelled", "--unlabelled-features", "--out",
                 "--force", "--model", "--checkpoint", "--quick-gelu", "--device", "--decode"):
        assert flag in text, flag
    for group in ("labelled images (few-shot):", "unlabelled images (transductive):"):
        body = text.split(group, 1)[1].split("\n\n", 1)[0]
        assert len(body.splitlines()) <= 3, body
    headings = {h.strip() for h in re.findall(r"^#+ (.+)$", (ROOT / "docs" / "usage.md").read_text(), re.M)}
    joined = re.sub(r"(\w)- (\w)", r"\1-\2", " ".join(text.split()))   # lines argparse wrapped at a hyphen
    named = set(re.findall(r'"([^"]+)"', joined))
    assert "Labelled images (few-shot)" in named and named <= headings | {"GELU or QuickGELU"}, named - headings
    assert "**GELU or QuickGELU.**" in (ROOT / "docs" / "usage.md").read_text()


def test_the_quickstart_says_to_activate_the_virtual_environment():
    from conftest import ROOT

    readme = (ROOT / "README.md").read_text()
    quick = readme.split("## Quickstart", 1)[1]
    assert quick.index(". .venv/bin/activate") < quick.index("$ svgen ")
    install = readme.split("```bash", 1)[1].split("```", 1)[0]
    assert "python3 -m venv .venv" in install   # the venv the line activates is the one the install made


def test_every_head_option_offers_the_heads_the_library_has():
    """classify, explain and diagnose share one --head choice list: the library's heads and the mixture."""
    from svgen.commands._common import HEAD_CHOICES
    from svgen.heads.calibration import MIXTURE
    from svgen.heads.scoring import HEADS

    assert HEAD_CHOICES == HEADS + (MIXTURE,)
