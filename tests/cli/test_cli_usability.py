"""The command line as a daily open_clip / scikit-learn user meets it (issue 16).

One section per item of the issue: order-free options and paths, shareable file modes, options
that cannot apply, duplicate classes, ``diagnose --plot``, export suffixes, strict JSON, clean
stdout, no library warnings, built-in class lists, checks before the encoder loads, help/API
consistency, input messages. The README's own commands are run by ``tests/cli/test_readme.py``.
"""

from __future__ import annotations

import json
import logging
import os
import runpy
import stat
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from svgen import SVGClassifier
from svgen.errors import SvgenError

from conftest import one_line_error as _one_line_error, strict_json

ROOT = Path(__file__).resolve().parents[2]
C, D = 5, 16
NAMES = ["cat", "dog", "bird", "fish", "horse"]


@pytest.fixture(scope="module")
def emb_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("emb")
    rng = np.random.default_rng(0)
    protos = rng.normal(size=(C, 2, D)).astype(np.float32)
    np.save(root / "protos.npy", protos)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    centers = protos.mean(1) / np.linalg.norm(protos.mean(1), axis=1, keepdims=True)
    y = np.repeat(np.arange(C), 4)
    x = centers[y] + 0.3 * rng.normal(size=(len(y), D)) / np.sqrt(D)
    np.save(root / "feats.npy", x.astype(np.float32))
    np.save(root / "labels.npy", y.astype(np.int64))
    return {"root": root, "protos": root / "protos.npy", "classes": root / "classes.txt",
            "feats": root / "feats.npy", "labels": root / "labels.npy", "x": x.astype(np.float32), "y": y}


@pytest.fixture(scope="module")
def art(emb_files):
    path = emb_files["root"] / "a.svgen"
    SVGClassifier(n_support=2, steps=3, ridge=1.0).fit(np.load(emb_files["protos"]), classes=NAMES).save(path)
    return path


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("img")
    rng = np.random.default_rng(1)
    paths = []
    for i in range(3):
        p = root / f"{i}.png"
        Image.fromarray(rng.integers(0, 255, size=(40, 40, 3), dtype=np.uint8)).save(p)
        paths.append(p)
    return paths


@pytest.fixture
def tiny_art(cli, tiny_model, tmp_path, classes_file):
    """A 3-class artifact fit through the tiny random-weight open_clip checkpoint."""
    classes = classes_file(["cat", "dog", "bird"])
    enc = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    code, _, err = cli("fit", "--classes", classes, *enc, "-K", "2", "--steps", "2", "--out", tmp_path / "t.svgen")
    assert code == 0, err
    return {"path": tmp_path / "t.svgen", "enc": enc, "classes": classes}


# ----------------------------------------------------------------------------- 1. order-free arguments

def test_paths_after_options_are_accepted(cli, tiny_art, images):
    a, b, c = images
    ref = cli("classify", tiny_art["path"], a, b, c, *tiny_art["enc"], "--top-k", "1")
    assert ref[0] == 0, ref[2]
    assert len(ref[1].strip().splitlines()) == 4  # header + 3 images
    for argv in (("classify", tiny_art["path"], "--top-k", "1", a, *tiny_art["enc"], b, c),
                 ("classify", tiny_art["path"], *tiny_art["enc"], a, b, "--top-k", "1", c),
                 ("classify", "--top-k", "1", tiny_art["path"], *tiny_art["enc"], a, b, c)):
        got = cli(*argv)
        assert got[0] == 0 and got[1] == ref[1], (argv, got[2])


def test_global_flags_after_the_command(cli, art, tmp_path):
    code, out, err = cli("export", art, "--out", tmp_path / "h.npz", "-q")
    assert code == 0 and out == "" and err == ""
    assert (tmp_path / "h.npz").is_file()
    from svgen.cli import build_parser, parse_args

    args = parse_args(build_parser(), ["-v", "export", str(art), "--out", "x.npz", "-v"])
    assert args.verbose == 2 and args.command == "export"  # counted on both sides
    assert parse_args(build_parser(), ["diagnose", str(art), "-q"]).quiet is True
    assert parse_args(build_parser(), ["diagnose", str(art)]).quiet is False


def test_bad_arguments_still_fail_with_usage(cli, art):
    with pytest.raises(SystemExit) as e:
        cli("classify", art, "--top-k")  # option without its value
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli("nonsense", art)
    assert e.value.code == 2


# ----------------------------------------------------------------------------- 2. files follow the umask

def _mode(p):
    return stat.S_IMODE(os.stat(p).st_mode)


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_written_files_follow_the_umask(cli, emb_files, tmp_path, umask):
    old = os.umask(umask)
    try:
        out = tmp_path / "u.svgen"
        assert cli("fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"], "-K", "2",
                   "--steps", "2", "--out", out)[0] == 0
        assert cli("export", out, "--out", tmp_path / "h.safetensors")[0] == 0
        assert cli("classify", out, "--features", emb_files["feats"], "--out", tmp_path / "p.csv")[0] == 0
        assert cli("eval", out, "--features", emb_files["feats"], "--labels", emb_files["labels"],
                   "--json", "--out", tmp_path / "e.json")[0] == 0
    finally:
        os.umask(old)
    assert _mode(out) == 0o777 & ~umask
    for f in (out / "svgen.json", out / "weights.safetensors", tmp_path / "h.safetensors", tmp_path / "p.csv",
              tmp_path / "e.json"):
        assert _mode(f) == 0o666 & ~umask, f


# ----------------------------------------------------------------------------- 3. options that cannot apply

@pytest.mark.parametrize("extra, named", [
    (["--model", "local-dir:/nonexistent"], "--model"),
    (["--checkpoint", "w.safetensors"], "--checkpoint"),
    (["--templates", "compact"], "--templates"),
    (["--model", "ViT-B-32", "--pretrained", "openai"], "--model and --pretrained"),
])
def test_prototypes_with_encoder_options_is_refused(cli, emb_files, tmp_path, extra, named):
    res = cli("fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"], *extra,
              "--out", tmp_path / "x.svgen")
    _one_line_error(*res, named, "--prototypes")
    assert not (tmp_path / "x.svgen").exists()


# ----------------------------------------------------------------------------- 4. duplicate classes

@pytest.mark.parametrize("names", [["Cat", "cat "], ["Cat", "dog", "cat ", "bird"]])
def test_classes_differing_only_in_case_are_named_before_the_solve(cli, tiny_model, classes_file, tmp_path, names):
    """--strict refuses them (issue 23: by default they fit, with a warning; tests/cli/test_daily_use.py)."""
    classes = classes_file(names)
    res = cli("fit", "--classes", classes, "--model", tiny_model["config"], "--checkpoint",
              tiny_model["safetensors"], "--steps", "2", "--strict", "--out", tmp_path / "d.svgen")
    line = _one_line_error(*res, "'Cat' and 'cat'", "case")
    assert "LinAlgError" not in line
    assert not (tmp_path / "d.svgen").exists()


def test_near_duplicate_prototypes_are_refused_by_the_api_when_strict():
    rng = np.random.default_rng(3)
    P = rng.normal(size=(4, D)).astype(np.float32)
    P[2] = P[0] + 1e-3 * rng.normal(size=D) * np.linalg.norm(P[0]) / np.sqrt(D)  # cos ≈ 0.999999
    cos = P[0] @ P[2] / np.linalg.norm(P[0]) / np.linalg.norm(P[2])
    assert 0.9999 <= cos < 1.0
    with pytest.raises(SvgenError, match="'a' and 'c'"):
        SVGClassifier(steps=1, strict=True).fit(P, classes=["a", "b", "c", "d"])
    P[2] = P[0] + 0.2 * rng.normal(size=D) * np.linalg.norm(P[0]) / np.sqrt(D)  # clearly distinct: fits
    SVGClassifier(n_support=2, steps=1).fit(P, classes=["a", "b", "c", "d"])


def test_add_classes_refuses_a_prototype_equal_to_an_existing_one(emb_files, art):
    clf = SVGClassifier.load(art)
    with pytest.raises(SvgenError, match="'dog' and 'hound'"):
        clf.add_classes(np.load(emb_files["protos"])[1:2], ["hound"])


def test_diagnose_names_duplicate_classes_as_the_cause(cli, emb_files, tmp_path):
    """An artifact whose classes 0 and 2 coincide (as fits of 'Cat'/'cat' were before this check)."""
    from safetensors.torch import load_file, save_file

    out = tmp_path / "dup.svgen"
    SVGClassifier(n_support=2, steps=2, ridge=1.0).fit(np.load(emb_files["protos"]), classes=NAMES).save(out)
    t = load_file(str(out / "weights.safetensors"))
    for name in ("prototypes", "support_vectors", "per_template"):
        t[name][2] = t[name][0]
    save_file(t, str(out / "weights.safetensors"))
    code, text, err = cli("diagnose", out)
    assert code == 0, err
    findings = text.split("findings:")[1]
    assert "duplicate classes" in findings and "'cat' and 'bird'" in findings
    assert "margin term" not in findings  # the margin term is not what went wrong
    code, text, _ = cli("diagnose", out, "--json")
    report = strict_json(text)
    assert [d[:2] for d in report["duplicate_classes"]] == [["cat", "bird"]]


# ----------------------------------------------------------------------------- 5. diagnose --plot

def test_plot_checks_come_before_the_work(cli, art, tmp_path, monkeypatch):
    import svgen.evaluation.diagnostics

    def no_work(*a, **k):
        raise AssertionError("diagnose ran before --plot was checked")

    monkeypatch.setattr(svgen.evaluation.diagnostics, "diagnose", no_work)
    _one_line_error(*cli("diagnose", art, "--plot", tmp_path / "missing" / "s.png"), "does not exist")
    _one_line_error(*cli("diagnose", art, "--plot", tmp_path / "s.jpg"), ".png")
    _one_line_error(*cli("diagnose", art, "--plot", tmp_path / "spectrum"), ".png")
    (tmp_path / "old.png").write_bytes(b"keep")
    _one_line_error(*cli("diagnose", art, "--plot", tmp_path / "old.png"), "--force")
    assert (tmp_path / "old.png").read_bytes() == b"keep"
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # not installed
    _one_line_error(*cli("diagnose", art, "--plot", tmp_path / "s.png"), "svgen[plot]")
    assert not list(tmp_path.glob("s*"))


def test_plot_is_written_like_every_other_out(cli, art, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "s.png").write_bytes(b"old")
    code, out, err = cli("diagnose", art, "--plot", tmp_path / "s.png", "--force")
    assert code == 0, err
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"wrote {tmp_path / 's.png'}" in err and "wrote" not in out
    assert [p.name for p in tmp_path.iterdir()] == ["s.png"]  # no temporary file left


def test_pyproject_has_a_plot_extra():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(req.startswith("matplotlib") for req in extras["plot"])


# ----------------------------------------------------------------------------- 6. export suffix / head files

@pytest.mark.parametrize("fmt, name", [("npz", "h.safetensors"), ("safetensors", "h.npz"), ("onnx", "h.npz")])
def test_export_suffix_contradicting_format_is_refused(cli, art, tmp_path, fmt, name):
    _one_line_error(*cli("export", art, "--format", fmt, "--out", tmp_path / name), fmt)
    assert not (tmp_path / name).exists()
    # a suffix that says nothing about the format is still fine with --format
    code, _, err = cli("export", art, "--format", "npz", "--out", tmp_path / "head.bin")
    assert code == 0, err


@pytest.mark.parametrize("name, content", [("h.safetensors", b"PK\x03\x04 not really a zip"),
                                           ("h.safetensors", b"\x00" * 4),
                                           ("h.npz", b"garbage"),
                                           ("h.onnx", b"garbage")])
def test_zero_shot_script_fails_in_one_line_on_an_unreadable_head(tmp_path, capsys, name, content, images):
    pytest.importorskip("onnxruntime") if name.endswith(".onnx") else None
    (tmp_path / name).write_bytes(content)
    main = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))["main"]
    code = main([str(tmp_path / name), str(images[0])])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1 and "zero_shot_classify: error:" in captured.err


def test_zero_shot_script_reads_a_real_npz_named_safetensors_as_an_error(cli, art, tmp_path, capsys, images):
    """The issue's own sequence, with the bytes written the old way (npz under a .safetensors name)."""
    assert cli("export", art, "--out", tmp_path / "h.npz")[0] == 0
    os.replace(tmp_path / "h.npz", tmp_path / "h.safetensors")
    main = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))["main"]
    capsys.readouterr()
    code = main([str(tmp_path / "h.safetensors"), str(images[0])])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "h.safetensors" in err


# ----------------------------------------------------------------------------- 7./8. strict JSON, clean stdout

def test_diagnose_json_is_strict_when_the_condition_number_is_infinite(cli, art, monkeypatch):
    import svgen.evaluation.diagnostics

    real = svgen.evaluation.diagnostics.diagnose

    def singular(*a, **k):
        report = real(*a, **k)
        report["condition_number"] = float("inf")
        return report

    monkeypatch.setattr(svgen.evaluation.diagnostics, "diagnose", singular)
    code, out, err = cli("diagnose", art, "--json")
    assert code == 0, err
    assert strict_json(out)["condition_number"] is None


def test_fit_stdout_is_one_json_object_and_minus_q_silences_the_rest(cli, emb_files, tmp_path):
    code, out, err = cli("fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"], "-K", "2",
                         "--steps", "2", "--out", tmp_path / "a.svgen")
    assert code == 0, err
    summary = strict_json(out)  # what `svgen fit … | jq .sigma` needs
    assert summary["sigma"] > 0
    assert f"wrote {tmp_path / 'a.svgen'}" in err
    code, out, err = cli("-q", "fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"],
                         "-K", "2", "--steps", "2", "--out", tmp_path / "b.svgen")
    assert code == 0 and err == "" and strict_json(out)["sigma"] == summary["sigma"]


def test_human_lines_of_export_and_add_classes_go_to_stderr(cli, emb_files, art, tmp_path):
    code, out, err = cli("export", art, "--out", tmp_path / "h.npz")
    assert code == 0 and out == "" and err.startswith(f"wrote {tmp_path / 'h.npz'}")
    import shutil

    shutil.copytree(art, tmp_path / "b.svgen")
    rng = np.random.default_rng(9)
    np.save(tmp_path / "new.npy", rng.normal(size=(1, D)).astype(np.float32))
    (tmp_path / "new.txt").write_text("zebra\n")
    code, out, err = cli("add-classes", tmp_path / "b.svgen", "--classes", tmp_path / "new.txt",
                         "--prototypes", tmp_path / "new.npy")
    assert code == 0 and out == "" and "5 → 6 classes" in err


def test_classify_and_eval_out_say_what_they_wrote(cli, art, emb_files, tmp_path):
    code, out, err = cli("classify", art, "--features", emb_files["feats"], "--out", tmp_path / "p.csv")
    assert code == 0 and out == "" and err.startswith(f"wrote {tmp_path / 'p.csv'}: {len(emb_files['y'])} row(s)")
    code, out, err = cli("eval", art, "--features", emb_files["feats"], "--labels", emb_files["labels"],
                         "--out", tmp_path / "e.txt", "-q")
    assert code == 0 and out == "" and err == "" and (tmp_path / "e.txt").read_text().startswith("head")


def test_eval_json_is_strict(cli, art, emb_files):
    code, out, err = cli("eval", art, "--features", emb_files["feats"], "--labels", emb_files["labels"], "--json")
    assert code == 0, err
    assert set(strict_json(out)) == {"cosine", "kernel", "linear", "default_head"}


# ----------------------------------------------------------------------------- 9. no library warnings

def test_an_interactive_fit_shows_no_library_warnings(cli, emb_files, tmp_path, monkeypatch):
    monkeypatch.setenv("SVGEN_PROGRESS", "1")  # what a terminal gets: progress bar on
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        code, out, err = cli("fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"],
                             "-K", "2", "--steps", "3", "--out", tmp_path / "a.svgen")
    assert code == 0, err
    assert [str(w.message) for w in caught] == []
    assert "Warning" not in err


# ----------------------------------------------------------------------------- 10. built-in class lists

def test_builtin_class_list_by_name(cli, tmp_path):
    from svgen.encoders.prompts import read_classes

    cifar = read_classes(ROOT / "prompts" / "classes" / "cifar10.txt")
    assert read_classes("cifar10") == cifar and len(cifar) == 10
    assert len(read_classes("cifar100")) == 100 and len(read_classes("imagenet1k")) == 1000
    rng = np.random.default_rng(0)
    np.save(tmp_path / "p.npy", rng.normal(size=(10, D)).astype(np.float32))
    code, _, err = cli("fit", "--classes", "cifar10", "--prototypes", tmp_path / "p.npy", "-K", "2", "--steps", "1",
                       "--out", tmp_path / "c.svgen")
    assert code == 0, err
    assert json.loads((tmp_path / "c.svgen" / "svgen.json").read_text())["classes"] == cifar
    line = _one_line_error(*cli("fit", "--classes", "cifar11", "--prototypes", tmp_path / "p.npy",
                                "--out", tmp_path / "d.svgen"), "cifar11")
    assert "cifar10" in line and "imagenet1k" in line


def test_readme_uses_the_builtin_name():
    readme = (ROOT / "README.md").read_text()
    assert "--classes cifar10 " in readme
    assert "--classes prompts/classes/" not in readme


# ----------------------------------------------------------------------------- 11. checks before the encoder loads

@pytest.fixture
def no_encoder(monkeypatch):
    from svgen.encoders.clip import ClipEncoder

    def refuse(self, *a, **k):
        raise AssertionError("the encoder was loaded")

    monkeypatch.setattr(ClipEncoder, "__init__", refuse)


def test_add_classes_checks_names_before_loading_the_encoder(cli, tiny_art, tmp_path, request):
    (tmp_path / "more.txt").write_text("fish\ndog\n")
    before = (tiny_art["path"] / "weights.safetensors").read_bytes()
    request.getfixturevalue("no_encoder")
    _one_line_error(*cli("add-classes", tiny_art["path"], "--classes", tmp_path / "more.txt", *tiny_art["enc"]),
                    "already in the artifact", "'dog'")
    (tmp_path / "dup.txt").write_text("fish\nfish\n")
    _one_line_error(*cli("add-classes", tiny_art["path"], "--classes", tmp_path / "dup.txt", *tiny_art["enc"]),
                    "duplicate", "'fish'")
    assert (tiny_art["path"] / "weights.safetensors").read_bytes() == before


def test_fully_cached_refit_does_not_load_the_model(cli, tiny_art, tmp_path, request):
    request.getfixturevalue("no_encoder")
    code, _, err = cli("fit", "--classes", tiny_art["classes"], *tiny_art["enc"], "-K", "2", "--steps", "2",
                       "--out", tmp_path / "again.svgen")
    assert code == 0, err
    first = json.loads((tiny_art["path"] / "svgen.json").read_text())
    again = json.loads((tmp_path / "again.svgen" / "svgen.json").read_text())
    assert again["encoder"] == first["encoder"]  # the same identity, checkpoint sha256 included
    from safetensors.torch import load_file

    a, b = load_file(str(tiny_art["path"] / "weights.safetensors")), load_file(str(tmp_path / "again.svgen" / "weights.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    # add-classes of a cached name is also model-free; a wrong checkpoint is refused before loading
    (tmp_path / "other.safetensors").write_bytes(b"x")
    (tmp_path / "new.txt").write_text("fish\n")
    _one_line_error(*cli("add-classes", tiny_art["path"], "--classes", tmp_path / "new.txt",
                         "--model", tiny_art["enc"][1], "--checkpoint", tmp_path / "other.safetensors"),
                    "does not match")


def test_encoder_identity_without_loading_matches_the_loaded_encoder(tiny_model):
    from svgen.encoders.clip import ClipEncoder
    from svgen.encoders.identity import encoder_identity

    for model, ckpt in ((tiny_model["config"], tiny_model["safetensors"]), (tiny_model["config"], tiny_model["pt"]),
                        (tiny_model["local_dir"], None)):
        assert encoder_identity(model, None, ckpt) == ClipEncoder(model, checkpoint=ckpt).identity()
    assert encoder_identity(tiny_model["config"], None, "/nonexistent.safetensors") is None


# ----------------------------------------------------------------------------- 13. help and API consistency

def _help(capsys, *argv):
    from svgen.cli import main

    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())


def test_help_texts(capsys):
    text = _help(capsys, "add-classes")
    pretrained = text.split("--pretrained TAG")[-1].split("--checkpoint")[0]
    assert "artifact's" in pretrained and "openai" not in pretrained
    for command in ("diagnose", "add-classes", "export", "eval", "classify"):
        text = _help(capsys, command)
        after = text.split("positional arguments:")[1].split("options:")[0]
        assert after.strip().startswith("ARTIFACT_DIR artifact written by 'svgen fit'"), (command, after)
    fit, classify = _help(capsys, "fit"), _help(capsys, "classify")   # one letter, one meaning (issue 40, item 16)
    assert "-K N_SUPPORT, --n-support N_SUPPORT" in fit and "-k N_SUPPORT" not in fit
    assert "-k TOP_K, --top-k TOP_K" in classify and "-K TOP_K" not in classify


def test_k_spellings(cli, emb_files, art, tmp_path):
    """fit: -K/--n-support; classify: -k/--top-k (each command refuses the other's letter: test_issue40_cli.py)."""
    code, _, err = cli("fit", "--prototypes", emb_files["protos"], "--classes", emb_files["classes"], "-K", "3",
                       "--steps", "1", "--out", tmp_path / "k.svgen")
    assert code == 0, err
    assert json.loads((tmp_path / "k.svgen" / "svgen.json").read_text())["n_support"] == 3
    for flag in ("-k", "--top-k"):
        code, out, _ = cli("classify", art, "--features", emb_files["feats"], flag, "2")
        assert code == 0 and out.splitlines()[0] == "index,source,row,label_1,score_1,label_2,score_2,head", flag


def test_zero_shot_script_help_shows_defaults(capsys):
    main = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))["main"]
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("(default: 5)", "(default: csv)", "(default: 32)", "(default: cpu)"):
        assert default in text
    assert "(default: None)" not in text


def test_save_message_names_the_parameter(art):
    clf = SVGClassifier.load(art)
    with pytest.raises(SvgenError) as e:
        clf.save(art)
    assert "force=True" in str(e.value) and "--force" not in str(e.value)
    clf.save(art, force=True)


def test_sklearn_clone_params_repr_score(emb_files):
    sklearn_base = pytest.importorskip("sklearn.base")
    clf = SVGClassifier(n_support=2, steps=3, ridge=1.0)
    assert repr(clf) == "SVGClassifier(n_support=2, steps=3, ridge=1.0)"
    twin = sklearn_base.clone(clf)
    assert twin is not clf and twin.get_params() == clf.get_params()
    assert twin.set_params(steps=5) is twin and twin.steps == 5 and clf.steps == 3
    with pytest.raises(SvgenError, match="invalid parameter 'bogus'"):
        twin.set_params(bogus=1)
    protos, x, y = np.load(emb_files["protos"]), emb_files["x"], emb_files["y"]
    clf.fit(protos, classes=NAMES)
    scores = clf.decision_function(x)
    assert isinstance(scores, np.ndarray) and scores.shape == (len(y), C)
    assert isinstance(clf.decision_function(torch.from_numpy(x)), torch.Tensor)
    acc = float(np.mean(scores.argmax(1) == y))  # independent: argmax of the scores against the indices
    assert clf.score(x, y) == pytest.approx(acc)
    assert clf.score(x, np.asarray(NAMES)[y]) == pytest.approx(acc)
    assert clf.score(x, y.astype(np.float64)) == pytest.approx(acc)
    # a fitted clone is unfitted, with the same settings (scikit-learn semantics)
    fresh = sklearn_base.clone(clf)
    assert not hasattr(fresh, "support_vectors_") and fresh.get_params() == clf.get_params()
    from sklearn.model_selection import ParameterGrid

    assert [SVGClassifier(**p).n_support for p in ParameterGrid({"n_support": [1, 2]})] == [1, 2]


# ----------------------------------------------------------------------------- 14. input messages

def test_plain_text_labels_file_message(cli, art, emb_files, tmp_path):
    (tmp_path / "labels.txt").write_text("\n".join(str(v) for v in emb_files["y"]) + "\n")
    line = _one_line_error(*cli("eval", art, "--features", emb_files["feats"], "--labels", tmp_path / "labels.txt"),
                           "labels.txt", "not a .npy file", "numpy.save")
    assert "pickle" not in line


def test_integral_float_labels_are_accepted(cli, art, emb_files, tmp_path):
    np.save(tmp_path / "f.npy", emb_files["y"].astype(np.float64))
    ref = cli("eval", art, "--features", emb_files["feats"], "--labels", emb_files["labels"], "--json")
    got = cli("eval", art, "--features", emb_files["feats"], "--labels", tmp_path / "f.npy", "--json")
    assert got[0] == 0 and got[1] == ref[1], got[2]
    np.save(tmp_path / "half.npy", emb_files["y"].astype(np.float64) + 0.5)
    _one_line_error(*cli("eval", art, "--features", emb_files["feats"], "--labels", tmp_path / "half.npy"),
                    "0.5", "whole number")


def test_top_k_above_class_count_is_said_once(cli, art, emb_files):
    code, out, err = cli("classify", art, "--features", emb_files["feats"], "--top-k", "9")
    assert code == 0
    assert out.splitlines()[0].count("label_") == C
    assert err.count("--top-k 9") == 1 and f"{C} classes" in err
    code, out, err = cli("classify", art, "--features", emb_files["feats"], "--top-k", str(C))
    assert code == 0 and err == ""


def test_very_long_class_name_warning_names_it_briefly(cli, tiny_model, classes_file, tmp_path, caplog):
    long_name = "extremely " * 120 + "long class"  # 1,210 characters
    classes = classes_file(["cat", long_name, "dog"])
    with caplog.at_level(logging.WARNING, logger="svgen"):
        code, _, err = cli("fit", "--classes", classes, "--model", tiny_model["config"], "--checkpoint",
                           tiny_model["safetensors"], "-K", "2", "--steps", "1", "--out", tmp_path / "l.svgen")
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "token context" in r.getMessage()]
    assert len(warned) == 1
    assert "'extremely extremely" in warned[0] and f"({len(long_name)} characters)" in warned[0]
    assert len(warned[0]) < 300  # was 6 KB: every long prompt in full


# ----------------------------------------------------------------------------- piping into `head`

class _ClosedPipe:
    """A stdout whose reader has gone away (``| head``): every write raises BrokenPipeError."""

    def __init__(self, fd):
        self.fd = fd

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self):
        pass

    def fileno(self):
        return self.fd


def test_a_closed_pipe_is_not_a_traceback(art, emb_files, tmp_path, capsys, monkeypatch, tiny_art, cli, images):
    from svgen.cli import main

    spare = os.open(tmp_path / "spare", os.O_WRONLY | os.O_CREAT)  # the fd main points at /dev/null
    try:
        monkeypatch.setattr(sys, "stdout", _ClosedPipe(spare))
        assert main(["classify", str(art), "--features", str(emb_files["feats"])]) == 0
        assert capsys.readouterr().err == ""
        monkeypatch.undo()
        assert cli("export", tiny_art["path"], "--out", tmp_path / "h.npz")[0] == 0
        script = runpy.run_path(str(ROOT / "scripts" / "zero_shot_classify.py"))["main"]
        monkeypatch.setattr(sys, "stdout", _ClosedPipe(spare))
        assert script([str(tmp_path / "h.npz"), *map(str, images), "--checkpoint", tiny_art["enc"][3],
                       "--model", tiny_art["enc"][1]]) == 0
        assert "Traceback" not in capsys.readouterr().err
    finally:
        os.close(spare)
