"""The text-encoding benchmark runs and reports what the README quotes (on the tiny model)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "bench_text_encoding.py"


def test_bench_json(tiny_model, capsys):
    spec = importlib.util.spec_from_file_location("bench_text_encoding", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
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
