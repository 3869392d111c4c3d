"""The images benchmark's pieces that need no timing: its files, its table, and its place in the docs."""

from __future__ import annotations

from conftest import load_script


def _result(device="cpu", gpu=None):
    rows = [{"what": "svgen classify, in-process", "images_per_s": 300.0, "seconds": [2.0]},
            {"what": "open_clip loop, svgen's settings (batch 32, 1 workers)", "images_per_s": 250.0, "seconds": [2.4]},
            {"what": "open_clip loop, tuned (batch 256, 2 workers)", "images_per_s": 200.0, "seconds": [3.0]}]
    return {"machine": {"cpu": "CPU X", "cores": 2, "torch_threads": 2, "gpu": gpu, "load_average_1m": 1.0},
            "device": device, "model": "tiny", "n": 600, "files": "600 JPEGs", "rounds": 2, "rows": rows,
            "agreement": {"precision": "bf16", "min_cosine": 0.99998, "top1_agreement": 0.98},
            "text": {"prompts": 1600, "svgen_s": 1.0, "open_clip_s": 2.0, "speedup": 2.0, "min_prototype_cosine": 1.0,
                     "svgen_precision": "fp32", "open_clip_precision": "fp32"}}


def test_the_table_gives_each_row_against_both_loops():
    bench = load_script("bench_images")
    text = bench.markdown(_result())
    assert "| svgen classify, in-process | 300.0 | 1.50 | 1.20 | – |" in text
    assert "| open_clip loop, tuned (batch 256, 2 workers) | 200.0 | 1.00 | 0.80 | – |" in text
    assert "CPU X, 2 cores, torch threads 2" in text and "GPU" not in text.split("\n")[0]
    assert "min cosine 0.99998, top-1 agreement 98.0 %" in text and "2.00×" in text
    assert "GPU NVIDIA H200" in bench.markdown(_result("cuda", "NVIDIA H200"))


def test_rows_compare_each_round_with_its_own_loop():
    bench = load_script("bench_images")
    times = {"svgen classify, in-process": [2.0, 4.0, 3.0], "open_clip loop, svgen's settings (batch 32)": [4.0, 4.0, 1.5]}
    rows = bench.table_rows(times, 100)
    assert rows[0]["images_per_s"] == 50.0 and rows[1]["images_per_s"] == 100 / 1.5
    assert rows[0]["round_ratios_vs_same_settings"] == [2.0, 1.0, 0.5]
    assert rows[0]["median_ratio_vs_same_settings"] == 1.0 and rows[1]["median_ratio_vs_same_settings"] == 1.0
    assert "| 1.00 |" in bench.markdown({**_result(), "rows": rows + _result()["rows"][1:]})


def test_write_docs_replaces_only_its_own_section(tmp_path, monkeypatch):
    bench = load_script("bench_images")
    doc = tmp_path / "performance.md"
    doc.write_text("a\n<!-- bench_images:cpu-tiny:start -->\nold\n<!-- bench_images:cpu-tiny:end -->\n"
                   "b\n<!-- bench_images:cuda-vit:start -->\nkeep\n<!-- bench_images:cuda-vit:end -->\n")
    monkeypatch.setattr(bench, "DOC", doc)
    bench.write_docs("new\n", "cpu-tiny")
    assert doc.read_text() == ("a\n<!-- bench_images:cpu-tiny:start -->\nnew\n<!-- bench_images:cpu-tiny:end -->\n"
                               "b\n<!-- bench_images:cuda-vit:start -->\nkeep\n<!-- bench_images:cuda-vit:end -->\n")


def test_the_files_are_jpegs_of_the_stated_size(tmp_path):
    from PIL import Image

    bench = load_script("bench_images")
    paths, _ = bench.make_jpegs(tmp_path / "j", 3)
    assert len(paths) == 3
    for p in paths:
        with Image.open(p) as im:
            assert im.format == "JPEG" and im.size == (500, 375)
