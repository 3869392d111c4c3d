"""The default-templates fit benchmark: its cache fill is what a cached fit reads, and its summary's arithmetic."""

from __future__ import annotations

import json

import pytest

from conftest import load_script


def test_a_filled_cache_is_read_by_the_cli_without_encoding(tmp_path, cli, tiny_model, classes_file, monkeypatch):
    bench = load_script("bench_fit_prompts")
    from svgen.encoders.prompts import load_templates

    names = ["cat", "dog", "bird"]
    cache = tmp_path / "cache"
    bench.fill_cache(cache, tiny_model["safetensors"], tiny_model["config"], names, load_templates("openai-simple"),
                     tiny_model["dim"])
    monkeypatch.setenv("SVGEN_CACHE_DIR", str(cache))
    code, _, err = cli("fit", "--classes", classes_file(names), "--model", tiny_model["config"], "--checkpoint",
                       tiny_model["safetensors"], "--out", tmp_path / "a.svgen")
    assert code == 0, err
    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["metrics"]["runtime"]["prompts_encoded"] == 0 and len(meta["templates"]) == 7


def test_summary_scales_the_stock_build_to_the_whole_list_and_takes_ratios_to_it():
    bench = load_script("bench_fit_prompts")
    result = {"prompts": 1000, "templates": 10, "runs": {
        "open_clip classifier": [{"load_s": 2.0, "build_s": 10.0, "prompts": 100},
                                 {"load_s": 4.0, "build_s": 12.0, "prompts": 100}],
        "svgen fit, cold": [{"wall_s": w, "kernel_fit_s": 1.0, "prompts_encoded": 1000, "templates": 10}
                            for w in (30.0, 50.0, 40.0)],
        "python -c 'import torch, open_clip'": [{"wall_s": 5.0}]}}
    s = bench.summarise(result)
    stock = s["open_clip classifier"]
    assert stock["extrapolated"] and stock["wall_s"] == pytest.approx((2 + 10 * 10 + 4 + 12 * 10) / 2)
    assert stock["prompts_per_s"] == pytest.approx((10 + 100 / 12) / 2)
    assert s["svgen fit, cold"]["wall_s"] == 40.0
    assert s["svgen fit, cold"]["x_stock"] == pytest.approx(40.0 / 113.0)
    assert s["python -c 'import torch, open_clip'"]["x_stock"] == pytest.approx(5.0 / 113.0)
