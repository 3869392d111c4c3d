"""The README's console sessions still run and still print what the README shows.

``scripts/readme_sessions.py`` runs every ``$ command`` of README.md's console blocks in a
sandbox (../shared/data, the tiny random-weight model, a copy of the photos) and compares the
output line by line (numbers to 1e-3; measured times masked). Commands that need the real
ViT-B-32 weights are listed in its ``SKIP``. Takes about three minutes (two LVIS fits).
"""

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def readme_sessions():
    return runpy.run_path(str(ROOT / "scripts" / "readme_sessions.py"))


def test_session_parser_reads_commands_continuations_and_outputs(readme_sessions):
    text = "intro\n```console\n$ svgen fit --a \\\n      --b  # note\nwrote x\n{}\n$ ls\n```\n```python\n$ not run\n```\n"
    found = readme_sessions["sessions"](text)
    assert [(cmd, out) for cmd, out, _ in found] == [("svgen fit --a --b", ["wrote x", "{}"]), ("ls", [])]


def test_outputs_compare_numbers_with_a_tolerance(readme_sessions):
    same = readme_sessions["same"]
    assert same('{"sigma": 0.6542503, "wall_time_s": 92.7}', '{"sigma": 0.6542509, "wall_time_s": 3.1}')
    assert not same('{"sigma": 0.6542}', '{"sigma": 0.7542}')
    assert not same("kernel 66.11%", "linear 66.11%")
    assert not same("a\nb", "a")


def test_readme_sessions_reproduce(shared_data, readme_sessions):
    result = readme_sessions["check_readme"](log=lambda s: None)  # README.md, then docs/usage.md
    assert result["ran"] >= 25 and result["skipped"] == len(readme_sessions["SKIP"])
    assert result["mismatches"] == [], "\n\n".join(
        f"$ {m['command']}\n--- README\n{m['expected']}\n--- now\n{m['got']}" for m in result["mismatches"])


def test_readme_results_say_which_figures_are_dev_only():
    """Issue 49: the Results section leads with the held-out figures (data nobody tuned on) and says that every
    figure after them is on the data the defaults were tuned on."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    results = text.split("\n## Results\n", 1)[1].split("\n## ", 1)[0]
    table_at = results.index("| held-out set |")
    first_bullet = results.index("\n* ")
    assert "nobody tuned on" in results[:table_at]
    assert table_at < first_bullet, "the held-out table comes before the development bullets"
    between = results[table_at:first_bullet]
    assert "dev-only" in between and "../shared/data" in between
    rows = [line for line in results[table_at:first_bullet].splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) >= 6 and any("ImageNet" in r for r in rows) and any("LVIS odd half" in r for r in rows)
