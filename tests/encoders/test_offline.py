"""Weights that are neither cached nor downloadable: one line naming what was tried, no traceback.

Nothing here leaves the machine: either ``HF_HUB_OFFLINE=1``, or ``HF_ENDPOINT`` points at a
closed port on 127.0.0.1 so the reachability probe is refused at once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from svgen.encoders import hub
from svgen.errors import EncoderUnavailableError

# A real, downloadable tag; the tests that name it never reach the network (HF_HUB_OFFLINE is set and the model builder is patched to fail: nothing is fetched).
REAL_TAG = "openai"

ROOT = Path(__file__).resolve().parents[2]
CIFAR10 = ROOT / "prompts" / "classes" / "cifar10.txt"


def _closed_loopback_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(tmp_path, offline: bool, endpoint_port: int = None):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_")) and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}
    env["HF_HOME"] = str(tmp_path / "empty-hf-home")  # an empty Hugging Face cache
    env["XDG_CACHE_HOME"] = str(tmp_path / "empty-xdg-cache")
    env["SVGEN_CACHE_DIR"] = str(tmp_path / "svgen-cache")
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    # Even online, the endpoint is a closed loopback port: a probe can never leave the machine.
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{endpoint_port or _closed_loopback_port()}"
    env["no_proxy"] = env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def _svgen(args, env, cwd):
    # the fresh process forbids the network itself (loopback, the closed endpoint, stays allowed), as every test does
    cmd = [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT / 'tests')!r}); "
           "from netguard import forbid_network; forbid_network(); from svgen.cli import main; sys.exit(main())",
           *map(str, args)]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)  # a guard, not a timing


def _assert_one_line_error(proc, *expected):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("offline", [True, False], ids=["HF_HUB_OFFLINE", "closed-endpoint"])
def test_main_job_without_weights_fails_in_one_line(tmp_path, offline):
    art = tmp_path / "art"
    proc = _svgen(["fit", "--classes", CIFAR10, "--out", art], _env(tmp_path, offline), cwd=tmp_path)
    line = _assert_one_line_error(proc, "ViT-B-32", "openai", "--checkpoint", "local-dir:")
    assert ("HF_HUB_OFFLINE" in line) if offline else ("unreachable" in line and "127.0.0.1" in line)
    assert "hf-hub:" in line  # names where the weights would have come from
    assert not art.exists() and proc.stdout == ""


def test_hf_hub_name_without_weights(tmp_path):
    proc = _svgen(["fit", "--classes", CIFAR10, "--model", "hf-hub:svgen-test/no-such-model", "--out", tmp_path / "a"],
                  _env(tmp_path, offline=True), cwd=tmp_path)
    _assert_one_line_error(proc, "hf-hub:svgen-test/no-such-model", "--checkpoint", "local-dir:")


def test_other_tag_online_with_closed_endpoint(tmp_path):
    proc = _svgen(["fit", "--classes", CIFAR10, "--pretrained", "laion2b_s34b_b79k", "--out", tmp_path / "a"],
                  _env(tmp_path, offline=False), cwd=tmp_path)
    _assert_one_line_error(proc, "laion2b_s34b_b79k", "unreachable", "--checkpoint")


# ----------------------------------------------------------------------------- in process

@pytest.fixture
def nothing_cached(monkeypatch):
    monkeypatch.setattr(hub, "hf_cached", lambda repo, names: False)


def test_library_raises_before_building_the_model(nothing_cached, monkeypatch):
    import open_clip

    from svgen.encoders.clip import ClipEncoder

    def must_not_run(*a, **k):
        raise AssertionError("the model must not be built when its weights cannot be had")

    monkeypatch.setattr(open_clip, "create_model_and_transforms", must_not_run)
    with pytest.raises(EncoderUnavailableError) as e:
        ClipEncoder("ViT-B-32", pretrained=REAL_TAG)
    assert "\n" not in str(e.value) and "checkpoint=FILE" in str(e.value)   # the library's words
    assert "\n" not in e.value.cli_message and "--checkpoint FILE" in e.value.cli_message   # what the CLI prints


def test_probe_uses_the_endpoint_port(nothing_cached, monkeypatch):
    probed = []
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(hub, "host_reachable", lambda host, port=443, timeout=0: probed.append((host, port)) or False)
    with pytest.raises(EncoderUnavailableError, match="127.0.0.1:9 is unreachable"):
        hub.check_weights_reachable("ViT-B-32", "openai")
    assert probed == [("127.0.0.1", 9)]  # exactly one probe, and no other host


def test_offline_never_probes(nothing_cached, monkeypatch):
    monkeypatch.setattr(hub, "host_reachable", lambda *a, **k: pytest.fail("probed while HF_HUB_OFFLINE=1"))
    with pytest.raises(EncoderUnavailableError, match="HF_HUB_OFFLINE"):
        hub.check_weights_reachable("ViT-B-32", "openai")


def test_cached_weights_need_no_probe(monkeypatch):
    monkeypatch.setattr(hub, "hf_cached", lambda repo, names: True)
    monkeypatch.setattr(hub, "host_reachable", lambda *a, **k: pytest.fail("probed although cached"))
    hub.check_weights_reachable("ViT-B-32", "openai")


def test_local_sources_need_no_download(tmp_path):
    assert hub.download_plan("local-dir:/somewhere", None) is None
    assert hub.download_plan("ViT-B-32", None) is None
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"x")
    assert hub.download_plan("ViT-B-32", str(f)) is None


def test_closed_loopback_port_is_refused_quickly():
    assert hub.host_reachable("127.0.0.1", _closed_loopback_port(), timeout=2.0) is False


def test_netloc_and_ports(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:8080")
    assert hub.hub_host() == "127.0.0.1:8080" and hub._split_host("127.0.0.1:8080") == ("127.0.0.1", 8080)
    monkeypatch.setenv("HF_ENDPOINT", "http://mirror.example")
    assert hub.hub_host() == "mirror.example" and hub._split_host("mirror.example") == ("mirror.example", 80)
    monkeypatch.delenv("HF_ENDPOINT")
    assert hub.hub_host() == "huggingface.co" and hub._split_host("huggingface.co") == ("huggingface.co", 443)
