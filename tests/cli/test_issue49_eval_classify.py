"""``eval`` and ``classify`` agree, list every input and say what they do (issue 49, items 7, 9, 13, 15, 16).

* 7: a class listed twice (same name, same prototype: a *twin*) ties exactly with its first listing in every head,
  so the first wins and ``classify`` names it; ``eval`` with name labels counts a prediction right when its name is
  the label's, as one would judge ``classify``'s output;
* 9: ``classify --features F F`` classifies both copies, in order;
* 13: a dangling link, a FIFO and a link to a device named like images are reported as skipped in a folder scan and
  refused in one precise line when named (never opened: a FIFO blocks, ``/dev/zero`` never ends);
* 15: ``-v`` says what eval and classify spent their time on; a skipped file is said once;
* 16: eval scores each head once per block of rows.
"""

import dataclasses
import json
import os
import re

import numpy as np
import pytest
import torch

from svgen import SVGClassifier

C, D = 30, 32
TWINS = [1, 4, 7, 10, 13, 16]   # listed again, after the C classes


def _unit(x):
    x = np.asarray(x, dtype=np.float64)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """A zero-shot artifact of C classes plus six of them listed again (same name, same prototype), the same with
    labelled shots (given by name: so it has a mixture head), and labelled features, mostly of the twins."""
    root = tmp_path_factory.mktemp("twins")
    rng = np.random.default_rng(0)
    P = rng.normal(size=(C, D)).astype(np.float32)
    names = [f"c{i}" for i in range(C)] + [f"c{i}" for i in TWINS]
    P2 = np.concatenate([P, P[TWINS]])
    ys = np.repeat(np.arange(C), 2)
    shots = (_unit(P)[ys] + 0.9 * rng.normal(size=(len(ys), D)) / np.sqrt(D)).astype(np.float32)
    art = SVGClassifier(n_support=4, steps=5, seed=0).fit(P2, classes=names).save(root / "twins.svgen")
    clf = SVGClassifier(prototypes=P2, classes=names, n_support=4, steps=5, seed=0)
    clf.fit(shots, np.asarray([names[i] for i in ys]))
    if clf.heads_.calibration.mixture_weight is None:   # these shots chose one head: weigh both, for a mixture head
        clf.heads_.calibration = dataclasses.replace(clf.heads_.calibration, mixture_weight=0.5)
    shot_art = clf.save(root / "twins-shots.svgen")
    y = rng.choice(TWINS + [0, 2, 3], 400)   # mostly twins: where their tie decides the top class
    x = (_unit(P)[y] + 1.0 * rng.normal(size=(len(y), D)) / np.sqrt(D)).astype(np.float32)
    np.save(root / "x.npy", x)
    np.save(root / "y.npy", y)
    np.save(root / "ynames.npy", np.asarray([names[i] for i in y]))
    return {"art": art, "shots": shot_art, "x": x, "y": y, "names": names, "root": root}


@pytest.mark.parametrize("which", ["art", "shots"])
def test_twins_tie_exactly_in_every_head(twins, which):
    clf = SVGClassifier.load(twins[which])
    assert ("mixture" in clf.head_names_) == (which == "shots")
    x = torch.from_numpy(twins["x"])
    first = torch.as_tensor(TWINS)
    again = torch.arange(C, C + len(TWINS))
    for head in clf.head_names_:
        for values in (clf.decision_function(x, head=head), clf.logits(x, head=head),
                       clf.predict_proba(x, head=head)):
            assert torch.equal(values[:, first], values[:, again]), head
        p = clf.predict_proba(x, head=head)
        assert torch.allclose(p.sum(1), torch.ones(p.shape[0], dtype=p.dtype))
        # the first listing wins: a prediction is never the second copy
        assert int(clf.decision_function(x, head=head).argmax(1).max()) < C
    # the untied kernel vote of the two copies really differs (in its last bits zero-shot; with shots given by name
    # the shots went to the first listing), else this test would prove nothing
    from svgen.heads import predictor

    raw = predictor.scores(clf.heads_, clf.prototypes_, clf.fit_config_.kernel, x, "kernel")
    assert not torch.equal(raw[:, first], raw[:, again])


def test_a_shot_labelled_with_a_twins_second_index_is_a_shot_of_the_class(twins):
    """Twins are one class: shots given by the index of the second listing count as the class's (the first listing's),
    as shots given by name do, rather than go to a column the tie then hides."""
    rng = np.random.default_rng(1)
    second = {a: C + i for i, a in enumerate(TWINS)}
    y_first = np.repeat(np.asarray(TWINS), 3)
    X = (twins["x"][:len(y_first)] + 0.1 * rng.normal(size=(len(y_first), D))).astype(np.float32)
    by_first = SVGClassifier.load(twins["art"]).adapt(X, y_first)
    by_second = SVGClassifier.load(twins["art"]).adapt(X, np.asarray([second[c] for c in y_first]))
    for head in by_first.head_names_:
        np.testing.assert_array_equal(by_first.predict_proba(twins["x"], head=head),
                                      by_second.predict_proba(twins["x"], head=head))


def test_twins_are_the_same_name_and_prototype_only():
    from svgen.validation import twin_classes

    P = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [1.0, 0, 0], [0, 0, 1.0], [2.0, 0, 0]])
    # 'a' at 0, 2, 4 with one prototype (4 is 2× it: the same unit prototype); 'b' at 1 and 3 with two prototypes
    assert twin_classes(["a", "b", "a", "b", "a"], P).tolist() == [0, 1, 0, 3, 0]
    assert twin_classes(["a", "b", "c", "d", "e"], P) is None   # coinciding prototypes under distinct names
    assert twin_classes(["a", "b", "a", "b", "a"][:2], P[:2]) is None


def _classify_top1(cli, twins, head):
    code, out, err = cli("classify", twins["art"], "--features", twins["root"] / "x.npy", "--head", head, "-k", 5,
                         "--format", "jsonl")
    assert code == 0, err
    return [json.loads(line)["labels"] for line in out.splitlines()]


def test_eval_scores_name_labels_as_classify_names_its_predictions(cli, twins):
    truth = [twins["names"][i] for i in twins["y"]]
    results = {}
    for labels in ("y.npy", "ynames.npy"):
        code, out, err = cli("eval", twins["art"], "--features", twins["root"] / "x.npy", "--labels",
                             twins["root"] / labels, "--json")
        assert code == 0, err
        results[labels] = json.loads(out)
    for head in ("cosine", "kernel", "linear"):
        listed = _classify_top1(cli, twins, head)
        acc1 = np.mean([row[0] == t for row, t in zip(listed, truth)])
        acc5 = np.mean([t in row for row, t in zip(listed, truth)])
        for labels in ("y.npy", "ynames.npy"):
            assert results[labels][head]["acc1"] == pytest.approx(acc1, abs=1e-12), (head, labels)
            assert results[labels][head]["acc5"] == pytest.approx(acc5, abs=1e-12), (head, labels)


# ----------------------------------------------------------------------------- 16: each head scored once per block

@pytest.mark.parametrize("which", ["art", "shots"])
def test_eval_scores_each_head_once_per_block(twins, which, monkeypatch):
    """What a head costs is its kernel vote, linear map or cosine product: eval computes each once per block of rows
    and per head that uses it (the mixture: once for its kernel and once for its linear part), as classify does."""
    from svgen.evaluation.metrics import evaluate_heads
    from svgen.heads import predictor

    clf = SVGClassifier.load(twins[which])
    calls = {}
    for name in ("kernel_scores", "linear_logits", "cosine_logits"):
        real = getattr(predictor, name)

        def counted(*a, _real=real, _name=name, **kw):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **kw)

        monkeypatch.setattr(predictor, name, counted)
    n_blocks = int(np.ceil(len(twins["y"]) / 64))
    evaluate_heads(clf, twins["x"], twins["y"], block_rows=64)
    per_block = {"kernel_scores": 1, "linear_logits": 1, "cosine_logits": 1}
    if which == "shots":   # the mixture's kernel and linear parts
        per_block = {"kernel_scores": 2, "linear_logits": 2, "cosine_logits": 1}
    assert calls == {k: v * n_blocks for k, v in per_block.items()}


# ----------------------------------------------------------------------------- 9: every input listed is classified

def test_a_features_file_named_twice_is_classified_twice_in_order(cli, twins):
    f = twins["root"] / "x.npy"
    code, out, err = cli("classify", twins["art"], "--features", f, f, "-k", 2, "--format", "jsonl")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    n = len(twins["x"])
    assert len(rows) == 2 * n
    assert [r["index"] for r in rows] == list(range(2 * n))
    assert [r["row"] for r in rows] == list(range(n)) * 2 and {r["source"] for r in rows} == {str(f)}
    assert [r["labels"] for r in rows[:n]] == [r["labels"] for r in rows[n:]]


@pytest.fixture(scope="module")
def pictures(tiny_model, tmp_path_factory):
    """A tiny-model artifact and a folder of three PNGs with, named like images, a link to nothing, a FIFO and a link
    to /dev/zero."""
    from PIL import Image

    from svgen.cli import main

    root = tmp_path_factory.mktemp("pictures")
    (root / "classes.txt").write_text("cat\ndog\nbird\n")
    enc = ["--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"]]
    assert main(["-q", "fit", "--classes", str(root / "classes.txt"), *enc, "--steps", "2",
                 "--out", str(root / "a.svgen")]) == 0
    folder = root / "photos"
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(3):
        Image.fromarray(rng.integers(0, 255, (40, 48, 3), dtype=np.uint8)).save(folder / f"p{i}.png")
    (folder / "gone.jpg").symlink_to(root / "nowhere.jpg")
    os.mkfifo(folder / "pipe.jpg")
    (folder / "zero.jpg").symlink_to("/dev/zero")
    return {"root": root, "art": root / "a.svgen", "folder": folder, "enc": enc}


def test_a_folder_scan_reports_what_is_not_a_regular_file_as_skipped_once(cli, pictures, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="svgen"):
        code, out, err = cli("-v", "classify", pictures["art"], pictures["folder"], "-k", 1, "--format", "jsonl",
                             *pictures["enc"])
    assert code == 0, err
    assert sorted(json.loads(line)["path"].rsplit("/", 1)[1] for line in out.splitlines()) == ["p0.png", "p1.png",
                                                                                               "p2.png"]
    said = err + "\n".join(r.getMessage() for r in caplog.records)
    folder = pictures["folder"]
    for name, why in (("gone.jpg", f"a symbolic link to '{pictures['root'] / 'nowhere.jpg'}', which does not exist"),
                      ("pipe.jpg", "a FIFO (named pipe), not an image file"),
                      ("zero.jpg", "a symbolic link to '/dev/zero', a character device, not an image file")):
        assert err.count(f"svgen classify: skipped {folder / name}: {why}\n") == 1, err
        assert said.count(f"skipped {folder / name}") == 1, said   # said once, -v or not
    assert "skipped 3 of 6 file(s)" in err


@pytest.mark.parametrize("name, why", [("gone.jpg", "is a symbolic link to '{root}/nowhere.jpg', which does not exist"),
                                       ("pipe.jpg", "is a FIFO (named pipe), not an image file or a folder"),
                                       ("zero.jpg", "is a symbolic link to '/dev/zero', a character device, not an "
                                                    "image file or a folder")])
def test_named_explicitly_a_file_that_is_not_regular_is_one_precise_line(cli, pictures, name, why):
    code, out, err = cli("classify", pictures["art"], pictures["folder"] / name, *pictures["enc"])
    assert code == 2 and out == ""
    assert err == f"svgen classify: error: {pictures['folder'] / name} {why.format(root=pictures['root'])}\n"


def test_images_named_twice_are_classified_twice_in_order(cli, pictures):
    p0, p1 = pictures["folder"] / "p0.png", pictures["folder"] / "p1.png"
    code, out, err = cli("classify", pictures["art"], p0, p1, p0, "-k", 1, "--format", "jsonl", *pictures["enc"])
    assert code == 0, err
    assert [json.loads(line)["path"] for line in out.splitlines()] == [str(p0), str(p1), str(p0)]


# ----------------------------------------------------------------------------- 15: -v says where the time goes

STEP = re.compile(r"^(.+) in \d+\.\d\ds$")


def _steps(caplog):
    import logging

    return [m.group(1) for r in caplog.records if r.levelno == logging.INFO and r.name.startswith("svgen")
            for m in [STEP.match(r.getMessage())] if m]


def test_verbose_eval_and_classify_features_log_their_steps_with_times(cli, twins, caplog, monkeypatch):
    import logging

    monkeypatch.setenv("SVGEN_PROGRESS", "1")
    with caplog.at_level(logging.INFO, logger="svgen"):
        code, out, err = cli("-v", "eval", twins["shots"], "--features", twins["root"] / "x.npy", "--labels",
                             twins["root"] / "y.npy")
    assert code == 0, err
    steps = _steps(caplog)
    assert f"loaded {twins['shots']}" in steps
    assert any(s.startswith("eval: 4 heads (cosine, kernel, linear, mixture) on 400 row(s), 36 classes (cosine ")
               for s in steps), steps
    assert "400/400" in err   # the bar over the rows
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="svgen"):
        code, out, err = cli("-v", "classify", twins["art"], "--features", twins["root"] / "x.npy")
    assert code == 0, err
    steps = _steps(caplog)
    assert f"loaded {twins['art']}" in steps
    assert "classify: inputs scored and written (400 row(s), kernel head, 36 classes)" in steps, steps
    assert "400/400" in err


# ----------------------------------------------------------------------------- 7 on real data: LVIS with 19 names twice

def test_lvis_with_19_names_listed_twice_eval_and_classify_agree(cli, shared_data, tmp_path):
    d = shared_data / "clip-vit-b32"
    if not (d / "lvis_dev_image_features.npy").is_file():
        pytest.skip("LVIS CLIP embeddings are absent")
    names = (d / "lvis_classes.txt").read_text(encoding="utf-8").splitlines()
    P, y = np.load(d / "lvis_v1_clip_a+cname.npy"), np.load(d / "lvis_dev_labels.npy")
    again = sorted(set(y.tolist()))[:19]   # 19 classes of the dev half, listed a second time at the end
    (tmp_path / "classes.txt").write_text("\n".join(names + [names[i] for i in again]) + "\n", encoding="utf-8")
    np.save(tmp_path / "P.npy", np.concatenate([P, P[again]]))
    truth = [names[i] for i in y]
    np.save(tmp_path / "names.npy", np.asarray(truth))
    art = tmp_path / "lvis2.svgen"
    code, _, err = cli("-q", "fit", "--prototypes", tmp_path / "P.npy", "--classes", tmp_path / "classes.txt",
                       "-K", "2", "--steps", "2", "--ridge", "10", "--out", art)
    assert code == 0, err
    acc = {}
    for labels in (d / "lvis_dev_labels.npy", tmp_path / "names.npy"):
        code, out, err = cli("eval", art, "--features", d / "lvis_dev_image_features.npy", "--labels", labels, "--json")
        assert code == 0, err
        acc[labels.name] = {h: r["acc1"] for h, r in json.loads(out).items() if h != "default_head"}
    for head in ("kernel", "linear", "cosine"):
        code, out, err = cli("classify", art, "--features", d / "lvis_dev_image_features.npy", "--head", head, "-k", 1,
                             "--format", "jsonl")
        assert code == 0, err
        listed = np.mean([json.loads(line)["labels"][0] == t for line, t in zip(out.splitlines(), truth)])
        assert acc["lvis_dev_labels.npy"][head] == pytest.approx(listed, abs=1e-12), head
        assert acc["names.npy"][head] == pytest.approx(listed, abs=1e-12), head
