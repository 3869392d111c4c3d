"""Scaling machinery (svgen.core.scale): blocked = exact, RFF converges, sparse vote weights are faithful.

Correctness only; nothing here is timed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from svgen import SVGClassifier
from svgen.config import FitConfig
from svgen.core.ridge import krr_vote_weights, one_hot_blocks
from svgen.heads.scoring import kernel_scores
from svgen.core.kernels import RandomFourierFeatures, kernel
from svgen.core.losses import block_alignment
from svgen.core import scale


def clustered(C, K, D, seed=0, spread=0.3):
    g = torch.Generator().manual_seed(seed)
    centres = F.normalize(torch.randn(C, 1, D, generator=g), dim=-1)
    return F.normalize(centres + spread * torch.randn(C, K, D, generator=g) / math.sqrt(D) * 4, dim=-1)


@pytest.mark.parametrize("kind", ["rbf", "laplacian"])
def test_blocked_alignment_equals_exact(kind):
    S3 = clustered(37, 4, 16).double()
    flat = S3.reshape(-1, 16)
    exact = block_alignment(kernel(flat, flat, 0.8, kind), 37, 4)
    blocked = scale.blocked_alignment(S3, 0.8, kind, block=19)  # blocks that straddle classes
    assert abs(float(blocked) - float(exact)) < 1e-5


def test_blocked_alignment_gradients_match_exact():
    S3 = clustered(20, 3, 8).requires_grad_(True)
    log_sigma = torch.tensor(math.log(0.9), requires_grad=True)
    flat = S3.reshape(-1, 8)
    exact = block_alignment(kernel(flat, flat, log_sigma.exp()), 20, 3)
    g_exact = torch.autograd.grad(exact, [S3, log_sigma])
    blocked = scale.blocked_alignment(S3, log_sigma.exp(), block=7)
    g_blocked = torch.autograd.grad(blocked, [S3, log_sigma])
    for a, b in zip(g_exact, g_blocked):
        assert torch.allclose(a, b, atol=1e-5)


def _rff_error(m, orthogonal, seeds=4, paired=False):
    X = clustered(30, 4, 32, seed=1).reshape(-1, 32)
    Kx = kernel(X, X, 0.9)
    errs = []
    for s in range(seeds):
        phi = RandomFourierFeatures(32, m, orthogonal=orthogonal, seed=s, paired=paired)(X, 0.9)
        errs.append(float((phi @ phi.T - Kx).norm() / Kx.norm()))
    return float(np.mean(errs))


@pytest.mark.parametrize("orthogonal,paired", [(False, False), (True, False), (True, True)])
def test_rff_error_shrinks_as_m_grows(orthogonal, paired):
    errs = [_rff_error(m, orthogonal, paired=paired) for m in (64, 256, 1024)]
    assert errs[0] > errs[1] > errs[2]
    assert errs[2] < 0.1


def test_orthogonal_features_beat_plain_at_equal_m():
    assert _rff_error(256, True, seeds=6) < _rff_error(256, False, seeds=6)
    assert _rff_error(256, True, seeds=6, paired=True) < _rff_error(256, True, seeds=6)


def test_rff_features_follow_sigma():
    X = clustered(10, 4, 32, seed=6).reshape(-1, 32)
    f = RandomFourierFeatures(32, 4096, orthogonal=True, paired=True)
    for sigma in (0.5, 1.5):
        phi = f(X, sigma)
        assert float((phi @ phi.T - kernel(X, X, sigma)).abs().max()) < 0.1


def test_rff_alignment_close_to_exact():
    S3 = clustered(40, 4, 32, seed=2)
    flat = S3.reshape(-1, 32)
    exact = float(block_alignment(kernel(flat, flat, 0.9), 40, 4))
    approx = float(scale.rff_alignment(S3, 0.9, scale.rff_features(32, 4096, "rbf", True, 0)))
    assert abs(approx - exact) < 0.02 * exact


def test_plan_chooses_by_size_and_memory():
    cfg = FitConfig(batch_classes=256)
    small = scale.plan_fit(cfg, 100, 512, available=8 << 30)
    assert small.alignment_path == "exact" and small.vote_solver == "dense"
    huge = scale.plan_fit(FitConfig(batch_classes=100000), 21843, 512, available=8 << 30)
    assert huge.alignment_path == "rff" and huge.vote_solver == "local"
    mid = scale.plan_fit(FitConfig(batch_classes=4000), 4000, 512, available=1 << 30)
    assert mid.alignment_path == "blocked"
    forced = scale.plan_fit(FitConfig(solver="blocked", vote_solver="local"), 50, 512, available=8 << 30)
    assert forced.alignment_path == "blocked" and forced.vote_solver == "local"


def test_requested_dense_vote_solve_that_cannot_fit_is_refused_before_training():
    from svgen.errors import SvgenError

    with pytest.raises(SvgenError, match="vote_solver='dense' needs") as e:   # the library's words; the CLI's below
        scale.plan_fit(FitConfig(vote_solver="dense"), 21843, 512, available=24 << 30)  # 114 GiB system
    assert e.value.cli_message.startswith("--vote-solver dense needs") and "--vote-solver auto" in e.value.cli_message
    ok = scale.plan_fit(FitConfig(vote_solver="dense"), 1000, 512, available=24 << 30)  # 0.25 GiB
    assert ok.vote_solver == "dense" and ok.reason.endswith("requested")
    emb = F.normalize(torch.randn(30, 16, generator=torch.Generator().manual_seed(0)), dim=-1).numpy()
    with pytest.raises(SvgenError, match="vote_neighbours must be >= 1") as e:   # the parameter's name in Python
        SVGClassifier(vote_neighbours=0).fit(emb)
    assert e.value.cli_message == "--vote-neighbours must be >= 1, got 0"   # the flag's on the command line


def test_cli_vote_solver_and_neighbours(cli, classes_file, tmp_path, caplog):
    """--vote-solver local --vote-neighbours N reach the fit, are recorded, and survive a reload."""
    import json

    C, D = 24, 16
    emb = F.normalize(torch.randn(C, D, generator=torch.Generator().manual_seed(2)), dim=-1).numpy()
    np.save(tmp_path / "p.npy", emb)
    names = classes_file([f"class {i}" for i in range(C)])
    code, out, err = cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", names, "--out", tmp_path / "a.svgen",
                         "--steps", 2, "-K", 2, "--vote-solver", "local", "--vote-neighbours", 5)
    assert code == 0, err
    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["metrics"]["scale"]["vote_solver"] == "local" and meta["metrics"]["scale"]["vote_neighbours"] == 5
    assert meta["vote_weights"]["nnz"] == C * 5 * 2          # each column on 5 classes × K=2 support vectors
    assert SVGClassifier.load(tmp_path / "a.svgen").vote_neighbours == 5
    code, out, err = cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", names, "--out", tmp_path / "b.svgen",
                         "--vote-neighbours", 0)
    assert code != 0 and "--vote-neighbours must be >= 1" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "b.svgen").exists()
    # a small ridge leaves the Parzen regime the neighbourhood solve relies on: the user is told
    code, out, err = cli("fit", "--prototypes", tmp_path / "p.npy", "--classes", names, "--out", tmp_path / "c.svgen",
                         "--steps", 2, "-K", 2, "--vote-solver", "local", "--vote-neighbours", 2, "--ridge", 1e-3)
    # (the CLI's logging handler prints it as "svgen: WARNING: ..."; in-process, pytest holds the root logger)
    assert code == 0 and "sparse vote weights solve (K_SS + M·λ·I) A = Y only to a relative residual" in caplog.text
    res = json.loads((tmp_path / "c.svgen" / "svgen.json").read_text())["metrics"]["vote_weights"]["relative_residual"]
    assert res > 0.05 and meta["metrics"]["vote_weights"]["relative_residual"] < 0.05


@pytest.mark.parametrize("lam_scale", [100.0, 10.0])
def test_local_vote_weights_match_dense_solve(lam_scale):
    C, K, D = 150, 4, 32
    S3 = clustered(C, K, D, seed=3)
    flat = S3.reshape(-1, D).double()
    K_ss = kernel(flat, flat, 0.8)
    M = C * K
    lam = lam_scale * scale.extreme_eigenvalues(K_ss, iters=30)[1] / M  # the Parzen regime of ridge="auto"
    dense = krr_vote_weights(K_ss, one_hot_blocks(C, K, torch.float64), lam).float()
    sparse = scale.local_vote_weights(S3, 0.8, "rbf", lam, n_neighbours=16)
    assert sparse.is_sparse and sparse._nnz() == C * 16 * K
    rel = float((sparse.to_dense() - dense).norm() / dense.norm())
    assert rel < 0.05 / lam_scale * 10
    assert scale.vote_residual(S3, 0.8, "rbf", lam, sparse) < 0.05
    X = clustered(C, 2, D, seed=4, spread=0.5).reshape(-1, D)
    s_dense = kernel_scores(X, S3, 0.8, dense)
    s_sparse = kernel_scores(X, S3, 0.8, sparse, block_size=333)
    agree = float((s_dense.argmax(1) == s_sparse.argmax(1)).float().mean())
    assert agree > 0.98


@pytest.mark.parametrize("kind", ["rbf", "laplacian"])
def test_sparse_kernel_scores_equal_dense_product(kind):
    """The blocked, transposed sparse scoring path is k(x̂, S) @ A for the same A, over uneven blocks."""
    C, K, D = 150, 4, 32
    S3 = clustered(C, K, D, seed=6)
    g = torch.Generator().manual_seed(7)
    A = torch.randn(C * K, C, generator=g)
    A[torch.rand(C * K, C, generator=g) > 0.05] = 0.0
    X = torch.randn(37, D, generator=g)
    by_formula = kernel(F.normalize(X, dim=-1), S3.reshape(-1, D), 0.8, kind) @ A
    for block in (333, 600, 8192):
        got = kernel_scores(X, S3, 0.8, A.to_sparse(), kind=kind, block_size=block)
        assert got.shape == (37, C) and got.is_contiguous()
        torch.testing.assert_close(got, by_formula, atol=1e-5, rtol=1e-5)


def test_sparse_vote_weights_round_trip(tmp_path):
    g = torch.Generator().manual_seed(0)
    emb = F.normalize(torch.randn(40, 3, 16, generator=g), dim=-1).numpy()
    clf = SVGClassifier(n_support=2, steps=3, vote_solver="local", batch_classes=16).fit(emb)
    A = clf.vote_weights_
    assert A.is_sparse
    assert clf.fit_metrics_["scale"]["vote_solver"] == "local"
    assert clf.fit_metrics_["vote_weights"]["relative_residual"] < 0.05
    clf.save(tmp_path / "a.svgen")
    import json

    meta = json.loads((tmp_path / "a.svgen" / "svgen.json").read_text())
    assert meta["vote_weights"]["layout"] == "coo" and meta["vote_weights"]["shape"] == [80, 40]
    back = SVGClassifier.load(tmp_path / "a.svgen")
    assert back.vote_weights_.is_sparse
    assert torch.equal(back.vote_weights_.to_dense(), A.to_dense())
    X = torch.randn(25, 16, generator=g)
    assert torch.allclose(back.decision_function(X), clf.decision_function(X), atol=1e-6)
    # the contract formula, by hand, with the stored sparse matrix
    x = F.normalize(X, dim=-1)
    S = back.support_vectors_.reshape(-1, 16)
    by_hand = torch.exp(-((x[:, None, :] - S[None]) ** 2).sum(-1) / (2 * back.bandwidth_ ** 2)) @ back.vote_weights_.to_dense()
    assert torch.allclose(back.decision_function(X), by_hand, atol=1e-5)


def test_dense_artifacts_unchanged(tmp_path):
    emb = F.normalize(torch.randn(12, 16, generator=torch.Generator().manual_seed(1)), dim=-1).numpy()
    clf = SVGClassifier(n_support=2, steps=2).fit(emb)
    assert not clf.vote_weights_.is_sparse
    clf.save(tmp_path / "d.svgen")
    import json

    assert "vote_weights" not in json.loads((tmp_path / "d.svgen" / "svgen.json").read_text())
    assert not SVGClassifier.load(tmp_path / "d.svgen").vote_weights_.is_sparse


def test_condition_estimate_agrees_with_eigvalsh():
    S3 = clustered(100, 4, 24, seed=5)
    flat = S3.reshape(-1, 24).double()
    K_ss = kernel(flat, flat, 0.7)
    eig = torch.from_numpy(np.linalg.eigvalsh(K_ss.numpy()))
    est = scale.condition_estimate(S3, 0.7, "rbf", K_ss=K_ss, exact_max_m=64)  # force the iterative path
    assert "estimate" in est["method"]
    true = float(eig[-1] / eig[0])
    assert est["value"] is not None and 0.5 * true <= est["value"] <= 1.0001 * true
