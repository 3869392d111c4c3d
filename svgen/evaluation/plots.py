"""Reliability diagrams of a classifier's heads (``svgen eval --plot``; needs ``svgen[plot]``): the bins come from
:func:`svgen.evaluation.metrics.reliability`; heat maps of confused class pairs (``--confusions --plot``)."""

from __future__ import annotations

from typing import Dict, Optional

from svgen.errors import SvgenError


def _pyplot():
    """matplotlib's pyplot on the Agg backend, or one SvgenError line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SvgenError("plotting needs matplotlib: pip install 'svgen[plot]'",
                         cli="--plot needs matplotlib: pip install 'svgen[plot]'") from None
    return plt


def plot_reliability(per_head: Dict[str, dict], path, title: Optional[str] = None, force: bool = False) -> None:
    """Reliability diagrams side by side (one panel per head) into a PNG; needs ``svgen[plot]``.

    ``per_head``: ``{head: {"reliability": reliability(...), "ece", "nll", "temperature", "acc1"}}``.
    """
    plt = _pyplot()
    from svgen.safeio import atomic_file

    heads = list(per_head)
    fig, axes = plt.subplots(1, len(heads), figsize=(4 * len(heads), 4.2), sharey=True, squeeze=False)
    for ax, head in zip(axes[0], heads):
        info = per_head[head]
        r = info["reliability"]
        edges = r["edges"]
        width = edges[1] - edges[0]
        used = r["count"] > 0
        ax.bar(edges[:-1][used], r["accuracy"][used], width=width, align="edge", edgecolor="black", color="#4c72b0",
               label="accuracy in the bin")
        ax.plot((edges[:-1] + width / 2)[used], r["confidence"][used], "o", color="#c44e52", ms=5,
                label="mean confidence in the bin")
        ax.plot([0, 1], [0, 1], "k--", lw=1, label="perfect calibration")
        share = r["count"] / max(int(r["count"].sum()), 1)  # where the examples are
        ax.bar(edges[:-1], 0.15 * share / max(float(share.max()), 1e-12), width=width, align="edge", color="#999999",
               alpha=0.6, label="examples per bin (scaled)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        ax.set_xlabel("confidence (max probability)")
        ax.set_title(f"{head}: T={info['temperature']:.3g}\nECE {info['ece']:.3f}, NLL {info['nll']:.3f}")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(loc="lower right", fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    try:
        atomic_file(path, lambda p: fig.savefig(str(p), format="png", dpi=100), force=force)
    finally:
        plt.close(fig)


def plot_confusions(panels: Dict[str, "object"], names, path, title: Optional[str] = None, force: bool = False) -> None:
    """Heat maps of class pairs side by side into a PNG (``svgen diagnose --confusions --plot``, ``svgen eval
    --confusions --plot``): ``panels`` maps a panel's title to an n×n array over ``names`` (rows: the true class a,
    columns: the class b it is taken for; the diagonal is left blank)."""
    plt = _pyplot()
    import numpy as np

    from svgen.safeio import atomic_file

    labels = [str(n) if len(str(n)) <= 24 else str(n)[:23] + "…" for n in names]
    n = len(labels)
    side = max(4.0, 0.28 * n + 2.5)
    fig, axes = plt.subplots(1, len(panels), figsize=(side * len(panels), side), squeeze=False)
    for ax, (name, m) in zip(axes[0], panels.items()):
        m = np.array(m, dtype=np.float64)
        np.fill_diagonal(m, np.nan)
        im = ax.imshow(m, cmap="viridis", interpolation="nearest")
        ax.set_xticks(range(n))
        ax.set_yticks(range(n))
        ax.set_xticklabels(labels, rotation=90, fontsize=7)
        ax.set_yticklabels(labels, fontsize=7)
        ax.set_xlabel("taken for (b)")
        ax.set_ylabel("true class (a)")
        ax.set_title(name, fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    try:
        atomic_file(path, lambda p: fig.savefig(str(p), format="png", dpi=100), force=force)
    finally:
        plt.close(fig)
