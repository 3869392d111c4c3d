"""The settings are the model's (issue 47, item 5): ``AdaptConfig`` is defaulted once (``SVGClassifier``), given to
every stage, saved in ``svgen.json`` (``adapt_config``: the fields that differ from the defaults) and restored on
load, so a reload and ``add_classes`` adapt with the fit's settings; ``svgen fit --adapt-config FILE`` and
``svgen adapt --config FILE`` (JSON or TOML) set them, a bad field is one line naming it.

Each setting used below is seen in what the fit records: ``alphas=(0,)``, ``sigma_factors=(0.5,)`` and
``ridges=(0.1,)`` are the only candidates of their choices (the defaults choose otherwise on these shots), and
``max_queries=100`` bounds the text queries (the defaults score all 240).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from svgen import AdaptConfig, SVGClassifier, SvgenError
from svgen.adapt import pool as pool_adapt
from svgen.adapt import shots as shot_adapt
from svgen.adapt.config import DEFAULT
from svgen.io.settings import read_adapt_config

from conftest import one_line_error, strict_json

C, T, D = 6, 40, 16
NAMES = [f"class {i}" for i in range(C)]
SETTINGS = AdaptConfig(alphas=(0.0,), sigma_factors=(0.5,), ridges=(0.1,), max_queries=100)
SAVED = {"sigma_factors": [0.5], "ridges": [0.1], "alphas": [0.0], "max_queries": 100}
GOLDEN = Path(__file__).parent / "io" / "golden"


def _problem():
    rng = np.random.default_rng(0)
    P = rng.normal(size=(C, T, D)).astype(np.float32)
    y = np.repeat(np.arange(C), 4)
    X = (P.mean(1)[y] + 0.8 * rng.normal(size=(len(y), D))).astype(np.float32)
    new = rng.normal(size=(2, T, D)).astype(np.float32)
    return P, X, y, new


def _uses_settings(record: dict) -> bool:
    """Whether a ``fewshot`` record was fitted with :data:`SETTINGS`' grids (the only candidates they leave)."""
    return (list(record["linear"]["grid"]) == ["0"] and record["kernel"]["ridge_c"] == pytest.approx(0.1)
            and record["kernel"]["selection"]["sigma_factor"] == 0.5)


def _spy(monkeypatch, module) -> list:
    """The ``config`` each call of ``module.adapt`` (a stage) is given."""
    seen, real = [], module.adapt

    def spy(*a, **k):
        seen.append(k["config"])
        return real(*a, **k)

    monkeypatch.setattr(module, "adapt", spy)
    return seen


# ----------------------------------------------------------------------------- the library

def test_the_defaults_choose_otherwise_so_the_settings_are_visible():
    P, X, y, _ = _problem()
    default = SVGClassifier(n_support=2, seed=0).fit(P).adapt(X, y)
    assert not _uses_settings(default.fewshot_) and default.calibration_["queries"] == C * T
    assert default.adapt_config is None and default.adapt_config_ is DEFAULT   # None: the defaults, once
    chosen = SVGClassifier(n_support=2, seed=0, adapt_config=SETTINGS).fit(P).adapt(X, y)
    assert _uses_settings(chosen.fewshot_) and chosen.calibration_["queries"] == 100
    assert chosen.adapt_config_ is SETTINGS


def test_the_settings_round_trip_through_save_load_and_add_classes(tmp_path, monkeypatch):
    P, X, y, new = _problem()
    clf = SVGClassifier(n_support=2, seed=0, adapt_config=SETTINGS).fit(P, classes=NAMES).adapt(X, y)
    clf.save(tmp_path / "a.svgen")
    assert json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())["adapt_config"] == SAVED
    loaded = SVGClassifier.load(tmp_path / "a.svgen")
    assert loaded.adapt_config == SETTINGS and loaded.adapt_config_ == SETTINGS
    assert loaded.get_params()["adapt_config"] == SETTINGS                # a clone refits with them too
    shots_seen, pool_seen = _spy(monkeypatch, shot_adapt), _spy(monkeypatch, pool_adapt)
    loaded.add_classes(new, ["new 1", "new 2"])                           # the shots are solved in again
    assert shots_seen and all(c == SETTINGS for c in shots_seen)          # (and its refits for the new classes)
    assert _uses_settings(loaded.fewshot_)
    assert loaded.calibration_["queries"] == 100
    loaded.adapt(unlabelled=X)
    assert pool_seen and all(c == SETTINGS for c in pool_seen)
    loaded.save(tmp_path / "b.svgen")                                     # and saved again
    assert json.loads((tmp_path / "b.svgen" / "svgen.json").read_text())["adapt_config"] == SAVED


def test_a_text_only_artifact_keeps_its_settings_for_add_classes(tmp_path):
    P, _, _, new = _problem()
    SVGClassifier(n_support=2, seed=0, adapt_config=AdaptConfig(max_queries=100)).fit(P).save(tmp_path / "t.svgen")
    loaded = SVGClassifier.load(tmp_path / "t.svgen")
    loaded.add_classes(new, ["new 1", "new 2"])                           # text temperatures again: 100 queries
    assert loaded.calibration_["method"] == "text" and loaded.calibration_["queries"] == 100
    default = SVGClassifier(n_support=2, seed=0).fit(P).add_classes(new, ["new 1", "new 2"])
    assert default.calibration_["queries"] == (C + 2) * T


def test_a_changed_parameter_is_what_the_next_stage_uses_and_what_is_saved(tmp_path):
    P, X, y, _ = _problem()
    clf = SVGClassifier(n_support=2, seed=0).fit(P)
    clf.adapt_config = SETTINGS
    clf.adapt(X, y)
    assert _uses_settings(clf.fewshot_) and clf.adapt_config_ is SETTINGS
    clf.save(tmp_path / "a.svgen")
    assert SVGClassifier.load(tmp_path / "a.svgen").adapt_config == SETTINGS


def test_the_defaults_write_no_key_and_an_old_artifact_loads_with_the_defaults(tmp_path):
    P, _, _, _ = _problem()
    SVGClassifier(n_support=2, seed=0, adapt_config=AdaptConfig()).fit(P).save(tmp_path / "d.svgen")
    assert "adapt_config" not in json.loads((tmp_path / "d.svgen" / "svgen.json").read_text())
    for case in ("v1_zero_shot", "v3_one_shot", "legacy_v6_shots_pool_kept"):
        art = GOLDEN / case / "artifact"
        assert "adapt_config" not in json.loads((art / "svgen.json").read_text())
        old = SVGClassifier.load(art)
        assert old.adapt_config is None and old.adapt_config_ == AdaptConfig(), case


@pytest.mark.parametrize("stored, named", [
    ({"levl": 2.0}, "'levl' is not an AdaptConfig field (did you mean 'level'?)"),
    ({"level": -1.0}, "AdaptConfig.level must be a finite number >= 0, got -1.0"),
    ({"select_max": 2.5}, "AdaptConfig.select_max must be an integer >= 0, got 2.5"),
    ({"alphas": []}, "AdaptConfig.alphas must be a non-empty list"),
    ({"rounds": 0}, "AdaptConfig.rounds must be an integer >= 1, got 0"),
    ([1, 2], "must be a table of AdaptConfig fields, got list"),
])
def test_a_bad_stored_setting_is_one_line_naming_it(tmp_path, stored, named):
    P, _, _, _ = _problem()
    SVGClassifier(n_support=2, seed=0).fit(P).save(tmp_path / "a.svgen")
    meta_file = tmp_path / "a.svgen" / "svgen.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "adapt_config": stored}))
    with pytest.raises(SvgenError) as e:
        SVGClassifier.load(tmp_path / "a.svgen")
    assert named in str(e.value) and "'adapt_config'" in str(e.value) and "\n" not in str(e.value)


def test_from_dict_takes_json_lists_and_refuses_what_is_not_a_setting():
    cfg = AdaptConfig.from_dict({"alphas": [0, 1], "level": 2, "max_folds": 3})
    assert cfg.alphas == (0.0, 1.0) and cfg.level == 2.0 and cfg.max_folds == 3
    assert cfg.changed() == {"alphas": (0.0, 1.0), "level": 2.0, "max_folds": 3}
    assert AdaptConfig.from_dict(json.loads(json.dumps(SETTINGS.changed()))) == SETTINGS   # JSON round trip
    for bad in ({"level": True}, {"max_folds": 3.0}, {"alphas": ["0"]}, {"ridges": [1.0, float("nan")]}):
        with pytest.raises(SvgenError, match=f"^x: AdaptConfig.{next(iter(bad))} must be"):
            AdaptConfig.from_dict(bad, "x")


def test_toml_needs_python_3_11_or_tomli(tmp_path, monkeypatch):
    f = tmp_path / "s.toml"
    f.write_text("level = 2.0\nalphas = [0, 1]\n")
    if sys.version_info >= (3, 11):
        assert read_adapt_config(f) == AdaptConfig(level=2.0, alphas=(0.0, 1.0))
    monkeypatch.setitem(sys.modules, "tomllib", None)   # as on Python 3.10 without the tomli package
    monkeypatch.setitem(sys.modules, "tomli", None)
    with pytest.raises(SvgenError, match="needs Python 3.11 or the tomli package .* or write the settings as JSON"):
        read_adapt_config(f)


# ----------------------------------------------------------------------------- the command line

@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("adapt_config")
    P, X, y, new = _problem()
    np.save(root / "P.npy", P)
    np.save(root / "X.npy", X)
    np.save(root / "y.npy", y.astype(np.int64))
    np.save(root / "new.npy", new)
    (root / "classes.txt").write_text("\n".join(NAMES) + "\n")
    (root / "new.txt").write_text("new 1\nnew 2\n")
    (root / "settings.json").write_text(json.dumps(SAVED))
    (root / "ridge.toml").write_text("# only the ridge grid; everything else the defaults\nridges = [0.01]\n")
    return root


def _fit(cli, files, out, *more):
    return cli("fit", "--prototypes", files / "P.npy", "--classes", files / "classes.txt", "-K", "2",
               "--out", out, *more)


def _meta(path) -> dict:
    return json.loads((Path(path) / "svgen.json").read_text())


def test_fit_adapt_config_then_adapt_and_add_classes_use_it(cli, files, tmp_path):
    code, out, err = _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", files / "settings.json")
    assert code == 0, err
    assert strict_json(out)["adapt_config"] == SAVED and _meta(tmp_path / "a.svgen")["adapt_config"] == SAVED
    code, out, err = cli("adapt", tmp_path / "a.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                         files / "y.npy", "--out", tmp_path / "b.svgen")          # no --config: the artifact's own
    assert code == 0, err
    meta = _meta(tmp_path / "b.svgen")
    assert meta["adapt_config"] == SAVED and _uses_settings(meta["fewshot"]) and strict_json(out)["adapt_config"] == SAVED
    code, _, err = cli("add-classes", tmp_path / "b.svgen", "--classes", files / "new.txt", "--prototypes",
                       files / "new.npy")
    assert code == 0, err
    meta = _meta(tmp_path / "b.svgen")
    assert len(meta["classes"]) == C + 2 and meta["adapt_config"] == SAVED and _uses_settings(meta["fewshot"])


def test_adapt_config_replaces_the_artifacts_settings_whole(cli, files, tmp_path):
    assert _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", files / "settings.json")[0] == 0
    code, _, err = cli("adapt", tmp_path / "a.svgen", "--shot-features", files / "X.npy", "--shot-labels",
                       files / "y.npy", "--config", files / "ridge.toml", "--out", tmp_path / "b.svgen")
    assert code == 0, err
    meta = _meta(tmp_path / "b.svgen")
    assert meta["adapt_config"] == {"ridges": [0.01]} and meta["fewshot"]["kernel"]["ridge_c"] == pytest.approx(0.01)
    assert len(meta["fewshot"]["linear"]["grid"]) == len(DEFAULT.alphas)   # alphas: back to the defaults


def test_fit_shots_with_adapt_config(cli, files, tmp_path):
    code, out, err = _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", files / "settings.json",
                          "--shot-features", files / "X.npy", "--shot-labels", files / "y.npy")
    assert code == 0, err
    assert _uses_settings(_meta(tmp_path / "a.svgen")["fewshot"])


@pytest.mark.parametrize("name, text, words", [
    ("typo.json", '{"levl": 2}', ["'levl' is not an AdaptConfig field", "did you mean 'level'"]),
    ("value.json", '{"alphas": []}', ["AdaptConfig.alphas must be a non-empty list"]),
    ("count.toml", "select_max = 1.5\n", ["AdaptConfig.select_max must be an integer"]),
    ("broken.json", '{"level": ', ["is not valid JSON"]),
    ("broken.toml", "level = = 2\n", ["is not valid TOML"]),
    ("list.json", "[1, 2]", ["must be a table of AdaptConfig fields, got list"]),
    ("nan.json", '{"level": NaN}', ["is not valid JSON"]),
])
def test_a_bad_settings_file_is_one_line_exit_2_and_nothing_written(cli, files, tmp_path, name, text, words):
    f = tmp_path / name
    f.write_text(text)
    code, out, err = _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", f)
    one_line_error(code, out, err, f"--adapt-config {f}", *words)
    assert not (tmp_path / "a.svgen").exists()
    code, out, err = cli("adapt", GOLDEN / "v1_zero_shot" / "artifact", "--shot-features", files / "X.npy",
                         "--shot-labels", files / "y.npy", "--config", f, "--out", tmp_path / "b.svgen")
    one_line_error(code, out, err, f"--config {f}", *words)
    assert not (tmp_path / "b.svgen").exists()


def test_a_missing_settings_file_is_one_line(cli, files, tmp_path):
    code, out, err = _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", tmp_path / "none.json")
    one_line_error(code, out, err, "--adapt-config not found", "none.json")
    code, out, err = _fit(cli, files, tmp_path / "a.svgen", "--adapt-config", tmp_path)
    one_line_error(code, out, err, f"--adapt-config {tmp_path}", "not a regular file")


@pytest.mark.parametrize("command, flag", [("fit", "--adapt-config FILE"), ("adapt", "--config FILE"),
                                           ("add-classes", None)])
def test_help_explains_the_settings_files(capsys, command, flag):
    from svgen.cli import main

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    if flag is None:   # add-classes has no flag: it adapts with the artifact's own
        assert "with the settings it was adapted with (svgen.json adapt_config" in text
    else:
        assert flag in text and "JSON or TOML" in text and "svgen.json records the fields" in text
