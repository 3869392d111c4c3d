"""The method's math against independent computations (direct formulas, finite differences, numpy)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from svgen.errors import SvgenError

from svgen.core.generator import SupportVectorGenerator, template_anchors
from svgen.core.ridge import krr_vote_weights, one_hot_blocks, ridge_path_scores, top_eigenvalue
from svgen.heads.scoring import cosine_logits, kernel_scores, linear_logits
from svgen.core.kernels import kernel, median_heuristic
from svgen.core.losses import block_alignment, grounding_loss, kernel_alignment, multiclass_hinge, softmax_ce
from svgen.core.metric import lda_head, neighbour_difference_covariance, shrink_to_condition, text_precision
from svgen.zeroshot.training import choose_ridge


def _unit(n, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(n, d, generator=g, dtype=torch.float64), dim=-1)


def test_alignment_matches_direct_double_loop():
    C, K = 5, 3
    S = _unit(C * K, 8)
    sigma = 0.7
    Kmat = kernel(S, S, sigma).numpy()
    labels = np.repeat(np.arange(C), K)
    num = sum(Kmat[i, j] for i in range(C * K) for j in range(C * K) if labels[i] == labels[j])
    kk = sum(Kmat[i, j] ** 2 for i in range(C * K) for j in range(C * K))
    yy = sum(1.0 for i in range(C * K) for j in range(C * K) if labels[i] == labels[j])
    direct = num / math.sqrt(kk * yy)
    K_t = torch.tensor(Kmat)
    assert kernel_alignment(K_t, torch.tensor(labels)).item() == pytest.approx(direct, rel=1e-12)
    assert block_alignment(K_t, C, K).item() == pytest.approx(direct, rel=1e-12)


def test_rbf_and_laplacian_match_their_formulas():
    a, b = _unit(4, 6, 1), _unit(5, 6, 2)
    d = np.linalg.norm(a.numpy()[:, None] - b.numpy()[None], axis=-1)
    np.testing.assert_allclose(kernel(a, b, 0.5, "rbf").numpy(), np.exp(-d ** 2 / (2 * 0.25)), rtol=1e-10)
    np.testing.assert_allclose(kernel(a, b, 0.5, "laplacian").numpy(), np.exp(-d / 0.5), rtol=1e-6)
    # unnormalised inputs are L2-normalised first
    np.testing.assert_allclose(kernel(3 * a, 0.2 * b, 0.5).numpy(), kernel(a, b, 0.5).numpy(), rtol=1e-10)


def test_median_heuristic_matches_numpy():
    x = _unit(40, 7, 3)
    xn = x.numpy()
    d = np.linalg.norm(xn[:, None] - xn[None], axis=-1)
    iu = np.triu_indices(40, k=1)
    assert median_heuristic(x) == pytest.approx(float(np.median(d[iu])), rel=1e-6)


def test_gradient_through_the_krr_solve_matches_finite_differences():
    C, K, D = 3, 2, 4
    S0 = _unit(C * K, D, 4).requires_grad_(True)
    Q = _unit(6, D, 5)
    Y = one_hot_blocks(C, K, dtype=torch.float64)
    q_labels = torch.tensor([0, 1, 2, 0, 1, 2])

    def query_loss(S):
        Kss = kernel(S, S, 0.8)
        A = krr_vote_weights(Kss, Y, 1e-2)
        return F.cross_entropy(kernel(Q, S, 0.8) @ A, q_labels)

    assert torch.autograd.gradcheck(query_loss, (S0,), eps=1e-6, atol=1e-7)
    # and the gradient really flows through A: freezing A changes it
    S = S0.detach().clone().requires_grad_(True)
    query_loss(S).backward()
    S2 = S0.detach().clone().requires_grad_(True)
    A_frozen = krr_vote_weights(kernel(S0.detach(), S0.detach(), 0.8), Y, 1e-2)
    F.cross_entropy(kernel(Q, S2, 0.8) @ A_frozen, q_labels).backward()
    assert not torch.allclose(S.grad, S2.grad)


def test_krr_vote_weights_solve_the_regularised_system():
    C, K = 4, 3
    S = _unit(C * K, 5, 6)
    Kss = kernel(S, S, 0.6)
    Y = one_hot_blocks(C, K, dtype=torch.float64)
    A = krr_vote_weights(Kss, Y, 0.05)
    M = C * K
    np.testing.assert_allclose(((Kss + M * 0.05 * torch.eye(M)) @ A).numpy(), Y.numpy(), atol=1e-7)
    np.testing.assert_allclose(A.numpy(), np.linalg.solve(Kss.numpy() + M * 0.05 * np.eye(M), Y.numpy()), atol=1e-7)


def test_loo_path_matches_explicit_refits():
    C, K = 3, 3
    S = _unit(C * K, 4, 7)
    Kss = kernel(S, S, 0.9)
    Y = one_hot_blocks(C, K, dtype=torch.float64)
    M = C * K
    lam = 0.01
    wrong = 0
    for i in range(M):
        keep = [j for j in range(M) if j != i]
        Ki = Kss[keep][:, keep]
        # the LOO shortcut uses the full-data regulariser c = M·λ
        A = torch.linalg.solve(Ki + M * lam * torch.eye(M - 1, dtype=torch.float64), Y[keep])
        pred = Kss[i, keep] @ A
        wrong += int(pred.argmax() != Y[i].argmax())
    scores, _ = ridge_path_scores(Kss, Y, [lam], "loo")
    assert scores[0] == pytest.approx(wrong / M, abs=1e-4)


def test_auto_ridge_is_parzen_regime():
    S = _unit(30, 6, 8)
    Kss = kernel(S, S, 0.7)
    lam_max = float(torch.linalg.eigvalsh(Kss)[-1])
    assert top_eigenvalue(Kss) == pytest.approx(lam_max, rel=1e-6)
    lam, _ = choose_ridge(Kss, one_hot_blocks(10, 3, dtype=torch.float64), "auto", parzen_factor=100)
    assert lam * 30 == pytest.approx(100 * lam_max, rel=1e-6)


def test_hinge_and_ce_match_direct_formulas():
    z = torch.tensor([[2.0, 1.5, -1.0], [0.0, 3.0, 2.5], [1.0, 1.0, 1.0]])
    y = torch.tensor([0, 2, 1])
    expected = np.mean([max(0, 1 + 1.5 - 2.0), max(0, 1 + 3.0 - 2.5), max(0, 1 + 1.0 - 1.0)])
    assert multiclass_hinge(z, y).item() == pytest.approx(expected)
    logp = z - torch.logsumexp(z, dim=1, keepdim=True)
    assert softmax_ce(z, y).item() == pytest.approx(-logp[torch.arange(3), y].mean().item())


def test_grounding_is_one_minus_cosine_to_own_anchor():
    A = F.normalize(torch.tensor([[[1.0, 0, 0], [0, 1.0, 0]]]), dim=-1)
    S = F.normalize(torch.tensor([[[1.0, 0.2, 0], [0, 0, 1.0]]]), dim=-1)
    expected = ((1 - S[0, 0] @ A[0, 0]) + (1 - S[0, 1] @ A[0, 1])) / 2
    assert grounding_loss(S, A).item() == pytest.approx(expected.item())


def test_spread_anchors_are_symmetric_pairs_around_the_prototype():
    from svgen.core.metric import confusion_directions
    from svgen.zeroshot.training import spread_anchors

    P = _unit(30, 8, 14).float()
    anchors = template_anchors(P[:, None, :], 4)  # T=1: four copies of the prototype
    spread = spread_anchors(anchors, P, n_templates=1)
    dirs, theta = confusion_directions(P, 2)
    for j in range(2):
        tangent = F.normalize(dirs[j] - (P @ dirs[j])[:, None] * P, dim=-1)  # v minus its component along p
        np.testing.assert_allclose(spread[:, 2 * j].numpy(), F.normalize(P + theta * tangent, dim=-1).numpy(), atol=1e-6)
        np.testing.assert_allclose(spread[:, 2 * j + 1].numpy(), F.normalize(P - theta * tangent, dim=-1).numpy(), atol=1e-6)
    # each slot sits at angle atan(θ) from the prototype, and no two slots coincide
    np.testing.assert_allclose((spread * P[:, None]).sum(-1).numpy(), 1 / np.sqrt(1 + theta ** 2), atol=1e-6)
    cos = torch.einsum("ckd,cjd->ckj", spread, spread)
    assert (cos - 2 * torch.eye(4) < 0.999).all()
    # the mean direction of every class's anchors is its prototype: the cosine rule is never lost
    np.testing.assert_allclose(F.normalize(spread.mean(1), dim=-1).numpy(), P.numpy(), atol=1e-5)
    # odd K with one template: the prototype fills the last slot
    odd = spread_anchors(template_anchors(P[:, None, :], 3), P, n_templates=1)
    np.testing.assert_allclose(odd[:, 2].numpy(), P.numpy(), atol=1e-6)
    # T=2, K=4: the two template groups stay, the two surplus slots straddle the template mean
    E = F.normalize(P[:, None, :] + 0.1 * torch.randn(30, 2, 8, generator=torch.Generator().manual_seed(1)), dim=-1)
    P2 = F.normalize(E.mean(1), dim=-1)
    sp2 = spread_anchors(template_anchors(E, 4), P2, n_templates=2)
    np.testing.assert_allclose(sp2[:, :2].numpy(), E.numpy(), atol=1e-6)
    np.testing.assert_allclose(F.normalize(sp2[:, 2] + sp2[:, 3], dim=-1).numpy(), P2.numpy(), atol=1e-5)


def test_metric_strength_rule_and_its_limits():
    from svgen.core.metric import metric_strength, neighbour_pairs

    full = metric_strength(1.3, n_templates=1, n_pairs=600, dim=512)
    assert full["kappa"] == pytest.approx(1.3) and full["reliability"] == 1.0
    assert metric_strength(1.3, 2, 600, 512)["kappa"] == pytest.approx(1.15)
    assert metric_strength(1.3, 80, 600, 512)["kappa"] == pytest.approx(1 + 0.3 / 80)
    few = metric_strength(1.3, 1, 128, 512)
    assert few["kappa"] == pytest.approx(1 + 0.3 * 0.25) and "neighbour pairs" in few["reason"]
    # neighbour pairs against a direct count of distinct {c, nn(c)} sets
    P = _unit(40, 6, 21)
    sims = (P @ P.T).numpy()
    np.fill_diagonal(sims, -np.inf)
    direct = {frozenset((c, int(n))) for c, n in enumerate(sims.argmax(1))}
    assert neighbour_pairs(P) == len(direct)


def test_whitened_cosine_head_is_cosine_at_kappa_one_and_whitened_direction_otherwise():
    from svgen.core.metric import whitened_cosine_head

    P = _unit(12, 6, 31)
    x = _unit(20, 6, 32)
    prec1 = text_precision(P, 1.0).double()
    np.testing.assert_allclose(prec1.numpy(), np.eye(6), atol=1e-6)  # κ = 1: identity metric
    W, b = whitened_cosine_head(P, prec1)
    np.testing.assert_allclose((x @ W.T + b).numpy(), (x @ P.T).numpy(), atol=1e-6)  # the cosine rule
    prec = text_precision(P, 1.5).double()
    W, b = whitened_cosine_head(P, prec, scale=3.0)
    direct = np.stack([3 * prec.numpy() @ p / np.linalg.norm(prec.numpy() @ p) for p in P.numpy()])
    np.testing.assert_allclose(W.numpy(), direct, atol=1e-6)
    assert (b == 0).all()


def test_paired_bootstrap_matches_a_direct_loop():
    from svgen.evaluation.metrics import paired_bootstrap

    rng = np.random.default_rng(3)
    a, b = rng.random(200) < 0.7, rng.random(200) < 0.6
    out = paired_bootstrap(a, b, n_resamples=500, seed=11)
    ref_rng = np.random.default_rng(11)
    d = a.astype(float) - b.astype(float)
    means = []
    for s in range(0, 500, 256):
        idx = ref_rng.integers(0, 200, size=(min(256, 500 - s), 200))
        means.extend(d[i].mean() for i in idx)
    assert out["diff"] == pytest.approx(d.mean())
    assert out["low"] == pytest.approx(np.percentile(means, 2.5))
    assert out["high"] == pytest.approx(np.percentile(means, 97.5))
    assert out["low"] < out["diff"] < out["high"]
    same = paired_bootstrap(a, a)
    assert same["diff"] == same["low"] == same["high"] == 0.0  # identical classifiers: a zero-width interval
    with pytest.raises(SvgenError):
        paired_bootstrap(a, b[:10])


def test_generator_outputs_unit_vectors_starting_at_anchors():
    torch.manual_seed(0)
    P = _unit(6, 16, 9).float()
    E = F.normalize(P[:, None, :] + 0.1 * torch.randn(6, 5, 16), dim=-1)
    gen = SupportVectorGenerator(16, 3)
    anchors = template_anchors(E, 3)
    S = gen(P, anchors)
    assert S.shape == (6, 3, 16)
    np.testing.assert_allclose(S.norm(dim=-1).detach().numpy(), 1.0, atol=1e-6)
    # small initial residual: every support vector starts within a few degrees of its anchor
    assert (torch.einsum("ckd,ckd->ck", S, anchors) > 0.99).all()
    # anchors: templates dealt round-robin into K groups (group 0 = templates 0 and 3)
    np.testing.assert_allclose(anchors[:, 0].numpy(), F.normalize(E[:, [0, 3]].mean(1), dim=-1).numpy(), atol=1e-6)


def test_heads_match_their_formulas():
    x = torch.randn(7, 5, dtype=torch.float64)
    S = _unit(6, 5, 10)
    A = torch.randn(6, 3, dtype=torch.float64)
    xh = x / x.norm(dim=1, keepdim=True)
    d2 = ((xh[:, None] - S[None]) ** 2).sum(-1)
    np.testing.assert_allclose(kernel_scores(x, S, 0.4, A, block_size=4).numpy(),
                               (torch.exp(-d2 / (2 * 0.16)) @ A).numpy(), rtol=1e-9)
    W, b = torch.randn(3, 5, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    np.testing.assert_allclose(linear_logits(x, W, b).numpy(), (xh @ W.T + b).numpy(), rtol=1e-12)
    P = _unit(3, 5, 11)
    np.testing.assert_allclose(cosine_logits(x, P).numpy(), (100 * xh @ P.T).numpy(), rtol=1e-12)


def test_metric_shrinkage_hits_the_condition_number_and_lda_is_mahalanobis():
    P = _unit(50, 8, 12)
    cov = neighbour_difference_covariance(P)
    # direct: nearest other prototype by cosine
    sims = (P @ P.T).numpy()
    np.fill_diagonal(sims, -np.inf)
    nn = sims.argmax(1)
    diff = (P - P[nn]).numpy()
    np.testing.assert_allclose(cov.numpy(), diff.T @ diff / 50, atol=1e-12)
    sigma, delta = shrink_to_condition(cov, 1.5)
    eig = np.linalg.eigvalsh(sigma.numpy())
    assert eig[-1] / eig[0] == pytest.approx(1.5, rel=1e-6)
    assert 0 < delta < 1
    prec = text_precision(P, 1.5).double()
    W, b = lda_head(P, prec)
    x = _unit(9, 8, 13)
    lda = (x @ W.T + b).numpy()
    maha = -np.einsum("ncd,de,nce->nc", (x[:, None] - P[None]).numpy(), prec.numpy(), (x[:, None] - P[None]).numpy())
    # LDA logits = −Mahalanobis distance + a per-sample constant: identical rankings
    np.testing.assert_allclose(lda - lda.mean(1, keepdims=True), maha - maha.mean(1, keepdims=True), atol=1e-5)


def test_setup_geometry_pulls_template_groups_towards_the_prototype_by_the_metric_trust():
    from svgen.config import FitConfig
    from svgen.core.metric import metric_strength, neighbour_pairs
    from svgen.zeroshot.training import setup_geometry

    g = torch.Generator().manual_seed(5)
    E = F.normalize(torch.randn(40, 1, 8, generator=g) + 0.3 * torch.randn(40, 2, 8, generator=g), dim=-1)
    P = F.normalize(E.mean(1), dim=-1)
    cfg = FitConfig(n_support=2, metric="none")
    _, anchors, _ = setup_geometry(P, E, cfg)
    w = metric_strength(cfg.metric_condition, 2, neighbour_pairs(P), 8)["reliability"] / 2
    assert w == pytest.approx(0.5)  # 40 classes give enough pairs for an 8-d covariance; T = 2
    expected = F.normalize(P[:, None] + w * (E - P[:, None]), dim=-1)  # K = T = 2: one template per group
    np.testing.assert_allclose(anchors.numpy(), expected.numpy(), atol=1e-6)
    # few classes for the dimension: almost no trust, so the anchors sit on the prototype
    E_big = F.normalize(torch.randn(6, 1, 64, generator=g) + 0.3 * torch.randn(6, 2, 64, generator=g), dim=-1)
    P_big = F.normalize(E_big.mean(1), dim=-1)
    _, anchors, _ = setup_geometry(P_big, E_big, FitConfig(n_support=2, metric="none"))
    assert (torch.einsum("ckd,cd->ck", anchors, P_big) > 0.99).all()


def test_without_training_the_support_vectors_are_the_anchors():
    from svgen.config import FitConfig
    from svgen.zeroshot.training import generate_all, train_generator

    g = torch.Generator().manual_seed(7)
    E = F.normalize(torch.randn(30, 2, 12, generator=g), dim=-1)
    P = F.normalize(E.mean(1), dim=-1)
    state = train_generator(P, E, FitConfig(n_support=4, steps=0))
    S = generate_all(state.generator, P, state.anchors)
    np.testing.assert_allclose(S.numpy(), state.anchors.numpy(), atol=1e-6)
    trained = train_generator(P, E, FitConfig(n_support=4, steps=2, batch_classes=8))
    assert not torch.allclose(generate_all(trained.generator, P, trained.anchors), trained.anchors, atol=1e-4)
