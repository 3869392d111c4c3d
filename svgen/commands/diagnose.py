"""``svgen diagnose``: spectrum, effective rank, condition number and plain-language findings."""

from __future__ import annotations

import json

from ._common import HelpFormatter


def add_parser(sub):
    p = sub.add_parser(
        "diagnose",
        help="check an artifact's kernel: σ too small/large, clumped support vectors, ill-conditioning",
        description="Measure the kernel over the artifact's support vectors (a random subset of classes when "
                    "there are many): alignment, off-diagonal statistics, condition number, effective rank, "
                    "within-class spread; then say in plain words what looks wrong and why.",
        formatter_class=HelpFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR")
    p.add_argument("--plot", metavar="FILE.png", help="also save the eigenvalue spectrum as a PNG (needs matplotlib)")
    p.add_argument("--max-classes", type=int, default=1024, help="measure at most this many classes")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a report")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..artifacts import load_artifact
    from ..diagnostics import diagnose
    from ..errors import SvgenError

    meta, t = load_artifact(args.artifact)
    if args.max_classes < 2:
        raise SvgenError(f"--max-classes must be at least 2, got {args.max_classes}")
    # format 2 (images added): the generated text support vectors are what this diagnoses
    report = diagnose(t.get("text.support_vectors", t["support_vectors"]), float(t.get("text.bandwidth", t["bandwidth"])),
                      meta.get("kernel", "rbf"), args.max_classes)
    spectrum = report.pop("spectrum")
    if args.plot:
        _plot(spectrum, args.plot)
    if args.json:
        print(json.dumps(report))
        return 0
    print(f"{args.artifact}: {len(meta['classes'])} classes × K={report['n_support']}, {report['kernel']} kernel, "
          f"σ={report['sigma']:.4g}" + (f" (measured on {report['classes_measured']} classes)" if report["subset"] else ""))
    rows = [("kernel-target alignment", f"{report['alignment']:.4f}"),
            ("off-diagonal kernel mean ± std", f"{report['offdiag_mean']:.4g} ± {report['offdiag_std']:.3g}"),
            ("condition number", f"{report['condition_number']:.4g}"),
            ("effective rank", f"{report['effective_rank']:.1f} of {report['classes_measured'] * report['n_support']}"),
            ("within-class cos", "n/a (K=1)" if report["within_class_cos"] is None else f"{report['within_class_cos']:.4f}")]
    for name, value in rows:
        print(f"  {name:<32} {value}")
    print("findings:" if report["findings"] else "findings: none — the kernel looks healthy")
    for f in report["findings"]:
        print(f"  - {f}")
    return 0


def _plot(spectrum, path) -> None:
    from ..errors import SvgenError

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SvgenError("--plot needs matplotlib (pip install matplotlib)") from None
    import os
    import tempfile

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(spectrum.clamp_min(1e-16).numpy())
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue of K_SS")
    ax.set_title("kernel spectrum")
    fig.tight_layout()
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp)
        os.replace(tmp, path)
    finally:
        plt.close(fig)
        if os.path.exists(tmp):
            os.remove(tmp)
