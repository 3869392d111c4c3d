"""The text-encoding benchmark runs and reports what the README quotes (on the tiny model)."""

from __future__ import annotations

import json
import logging

from conftest import load_script


def test_bench_json(tiny_model, capsys, tmp_path, monkeypatch):
    bench = load_script("bench_text_encoding")
    monkeypatch.setattr(load_script("bench_common"), "RESULTS", tmp_path)   # not the repository's bench-results/
    root = logging.getLogger()
    level = root.level
    try:
        assert bench.main(["--model", "svgen-tiny", "--classes", "3", "--batch-size", "8", "--json"]) == 0
    finally:
        root.setLevel(level)
    result = json.loads(capsys.readouterr().out)
    assert result["prompts"] == 21 and result["templates"] == 7
    assert result["max_cosine_deviation"] < 1e-5 and result["speedup"] > 0
    assert result["mean_tokens_per_batch"] < result["context_length"]
    assert json.loads((tmp_path / "text_encoding.json").read_text()) == result
