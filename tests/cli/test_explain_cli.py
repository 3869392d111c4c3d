"""``svgen explain`` (issue 48): the parts it prints add up to the score ``svgen classify`` prints for the same rows;
bad input is one line and exit 2; shots given as image files are named by their paths, as features by file and row."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from conftest import one_line_error, strict_json, write_png_shots

GOLDEN = Path(__file__).resolve().parent.parent / "io" / "golden"


def _classify_scores(cli, art, feats, head, k):
    code, out, err = cli("classify", art, "--features", feats, "--head", head, "-k", str(k), "--format", "jsonl")
    assert code == 0, err
    return [strict_json(line) for line in out.splitlines()]


@pytest.mark.parametrize("case, head", [("v4_shots", "mixture"), ("v4_shots", "kernel"), ("v4_shots", "linear"),
                                        ("v6_shots_pool_kept", "mixture"), ("v1_local_votes", "kernel"),
                                        ("v6_zero_shot_pool_kept", "kernel")])
def test_json_parts_add_up_to_what_classify_prints(cli, case, head):
    art, feats = GOLDEN / case / "artifact", GOLDEN / case / "queries.npy"
    want = _classify_scores(cli, art, feats, head, 3)
    code, out, err = cli("explain", art, "--features", feats, "--head", head, "--json")
    assert code == 0, err
    got = [strict_json(line) for line in out.splitlines()]
    assert len(got) == len(want) == np.load(feats).shape[0]
    for g, w in zip(got, want):
        assert g["row"] == w["row"] and g["head"] == head
        assert [c["class"] for c in g["classes"]] == w["labels"]
        for c, s in zip(g["classes"], w["scores"]):
            assert abs(sum(c["parts"].values()) - s) <= max(1e-5, 2 * float(np.spacing(np.float32(abs(s)))))
        assert g["runner_up"] == w["labels"][1]


def test_rows_pick_rows_and_the_table_names_the_origins(cli, tmp_path):
    art, feats = GOLDEN / "v1_zero_shot" / "artifact", GOLDEN / "v1_zero_shot" / "queries.npy"
    code, out, err = cli("explain", art, "--features", feats, "--rows", "3,0", "--json", "--contributions", "2")
    assert code == 0, err
    got = [json.loads(line) for line in out.splitlines()]
    assert [g["row"] for g in got] == [3, 0]
    for g in got:
        for c in g["classes"]:
            assert len(c["for"]) <= 2 and len(c["against"]) <= 2
            assert all(s["kind"] in ("template group", "generated") and s["value"] > 0 for s in c["for"])
    code, out, err = cli("explain", art, "--features", feats, "--rows", "3", "-k", "2")
    assert code == 0, err
    assert "queries.npy[3]  (kernel head)" in out and "would have been" in out and "template group" in out


def test_bad_input_is_one_line(cli, tmp_path):
    art, feats = GOLDEN / "v1_zero_shot" / "artifact", GOLDEN / "v1_zero_shot" / "queries.npy"
    one_line_error(*cli("explain", art, "--features", feats, "--rows", "0,24"), "row 24 is out of range", "24 rows")
    one_line_error(*cli("explain", art, "--features", feats, "--rows", "x"), "--rows must be")
    one_line_error(*cli("explain", art, "--features", feats, "--head", "mixture"), "no mixture head")
    one_line_error(*cli("explain", art, "--features", feats, "--top-k", "0"), "--top-k must be at least 1")
    one_line_error(*cli("explain", art, "--rows", "1", tmp_path), "--rows picks rows of --features")
    one_line_error(*cli("explain", art), "nothing to explain")
    np.save(tmp_path / "wrong.npy", np.ones((2, 3), dtype=np.float32))
    one_line_error(*cli("explain", art, "--features", tmp_path / "wrong.npy"), "dimension 3")
    (tmp_path / "p.png").write_bytes(b"precious")
    one_line_error(*cli("explain", art, "--features", feats, "--plot", tmp_path / "p.png"), "already exists")
    assert (tmp_path / "p.png").read_bytes() == b"precious"


def test_plot_writes_a_png(cli, tmp_path):
    pytest.importorskip("matplotlib")
    art, feats = GOLDEN / "v4_shots" / "artifact", GOLDEN / "v4_shots" / "queries.npy"
    code, out, err = cli("explain", art, "--features", feats, "--rows", "0,1", "--plot", tmp_path / "why.png")
    assert code == 0, err
    assert (tmp_path / "why.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no file path or row" in err   # an artifact from before provenance says what it cannot name


def test_shot_features_are_named_by_file_and_row(cli, tmp_path):
    rng = np.random.default_rng(0)
    C, D = 4, 16
    P = rng.normal(size=(C, 2, D)).astype(np.float32)
    y = np.tile(np.arange(C), 3)
    X = (P.mean(1)[y] + 0.4 * rng.normal(size=(len(y), D))).astype(np.float32)
    np.save(tmp_path / "P.npy", P)
    np.save(tmp_path / "X.npy", X)
    np.save(tmp_path / "y.npy", y)
    (tmp_path / "classes.txt").write_text("".join(f"c{i}\n" for i in range(C)))
    code, _, err = cli("fit", "--prototypes", tmp_path / "P.npy", "--classes", tmp_path / "classes.txt", "-K", "2",
                       "--steps", "3", "--out", tmp_path / "zs.svgen")
    assert code == 0, err
    code, _, err = cli("adapt", tmp_path / "zs.svgen", "--shot-features", tmp_path / "X.npy", "--shot-labels",
                       tmp_path / "y.npy", "--out", tmp_path / "fs.svgen")
    assert code == 0, err
    meta = json.loads((tmp_path / "fs.svgen" / "svgen.json").read_text())
    assert meta["support_origin"]["image"] == [{"file": str(tmp_path / "X.npy"), "row": i} for i in range(len(y))]
    code, out, err = cli("explain", tmp_path / "fs.svgen", "--features", tmp_path / "X.npy", "--rows", "5",
                         "--head", "kernel", "--json")
    assert code == 0, err
    row = json.loads(out)
    froms = [s["from"] for c in row["classes"] for s in c["for"] + c["against"] if s["kind"] == "labelled shot"]
    assert froms and all(f.startswith(f"{tmp_path / 'X.npy'}[") for f in froms)
    code, _, err = cli("fit", "--prototypes", tmp_path / "P.npy", "--classes", tmp_path / "classes.txt", "-K", "2",
                       "--steps", "3", "--shot-features", tmp_path / "X.npy", "--shot-labels", tmp_path / "y.npy",
                       "--out", tmp_path / "fit-shots.svgen")
    assert code == 0, err   # fit with shots records them too
    meta = json.loads((tmp_path / "fit-shots.svgen" / "svgen.json").read_text())
    assert meta["support_origin"]["image"] == [{"file": str(tmp_path / "X.npy"), "row": i} for i in range(len(y))]


def test_image_inputs_shots_by_path_and_an_image_that_does_not_decode(cli, tiny_model, tmp_path):
    write_png_shots(tmp_path, ["red square", "green circle"], step=120)
    enc = ("--model", tiny_model["config"], "--checkpoint", tiny_model["safetensors"])
    code, _, err = cli("fit", "--classes", tmp_path / "classes.txt", *enc, "-K", "2", "--steps", "3",
                       "--out", tmp_path / "zs.svgen")
    assert code == 0, err
    code, _, err = cli("adapt", tmp_path / "zs.svgen", "--shots", tmp_path / "shots", *enc, "--out",
                       tmp_path / "fs.svgen")
    assert code == 0, err
    shot_files = sorted(str(p) for p in (tmp_path / "shots").rglob("*.png"))
    meta = json.loads((tmp_path / "fs.svgen" / "svgen.json").read_text())
    assert sorted(r["path"] for r in meta["support_origin"]["image"]) == shot_files
    photo = shot_files[0]
    code, out, err = cli("explain", tmp_path / "fs.svgen", photo, *enc, "--head", "kernel", "--json",
                         "--plot", tmp_path / "why.png")
    assert code == 0, err
    row = json.loads(out)
    assert row["path"] == photo
    froms = {s["from"] for c in row["classes"] for s in c["for"] + c["against"] if s["kind"] == "labelled shot"}
    assert froms and froms <= set(shot_files)
    assert (tmp_path / "why.png").stat().st_size > 1000
    (tmp_path / "broken.jpg").write_text("this is not a JPEG")
    one_line_error(*cli("explain", tmp_path / "fs.svgen", tmp_path / "broken.jpg", *enc), "cannot explain",
                   "broken.jpg")
