"""``svgen diagnose``: spectrum, effective rank, condition number and plain-language findings."""

from __future__ import annotations

from svgen.commands._common import HelpFormatter, json_text, note


def add_parser(sub):
    p = sub.add_parser(
        "diagnose",
        help="check an artifact's kernel: σ too small/large, clumped support vectors, ill-conditioning; after "
             "shots, heads worse than zero-shot",
        description="Measure the kernel over the artifact's support vectors (a random subset of classes when "
                    "there are many): alignment, off-diagonal statistics, condition number, effective rank, "
                    "within-class spread, classes whose prototypes coincide; then say in plain words what looks "
                    "wrong and why. On an adapted artifact (svgen adapt) it also describes the kernel classify "
                    "deploys: its support rows by source (text, image, pool), its σ, and what the adaptation "
                    "chose by leave-one-out; after labelled shots it also names any head that --head can select "
                    "but that is worse than zero-shot (the cosine head) on the fit's held-out shots "
                    "(svgen.json fewshot.heads_vs_zero_shot).",
        formatter_class=HelpFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit'")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also save the eigenvalue spectrum as a PNG (needs matplotlib: pip install 'svgen[plot]')")
    p.add_argument("--force", action="store_true", help="overwrite --plot if it exists")
    p.add_argument("--max-classes", type=int, default=1024, help="measure at most this many classes")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object instead of a report (strict JSON: an infinite condition number is null)")
    p.set_defaults(func=run)


def run(args) -> int:
    from svgen.io.artifacts import load_artifact
    from svgen.evaluation.diagnostics import diagnose
    from svgen.errors import SvgenError

    if args.max_classes < 2:
        raise SvgenError(f"--max-classes must be at least 2, got {args.max_classes}")
    plt = _check_plot(args.plot, args.force) if args.plot else None
    meta, t = load_artifact(args.artifact)
    # format 2 (images added): the generated text support vectors are what this diagnoses
    report = diagnose(t.get("text.support_vectors", t["support_vectors"]), float(t.get("text.bandwidth", t["bandwidth"])),
                      meta.get("kernel", "rbf"), args.max_classes, prototypes=t["prototypes"], classes=meta["classes"])
    spectrum = report.pop("spectrum")
    geometry = (meta.get("metrics") or {}).get("geometry")
    report["geometry"] = geometry  # the text-metric decision made at fit time (None: older artifact)
    from svgen.evaluation.diagnostics import deployed_kernel, describe_deployed
    from svgen.transductive.decision import Evidence, pool_evidence

    report["deployed"] = deployed_kernel(meta, t)  # None: the text kernel measured here is the one deployed
    from svgen.evaluation.heldout import findings as head_findings

    report["findings"] += head_findings(meta.get("fewshot"))   # a selectable head worse than zero-shot
    if plt is not None:
        _plot(plt, spectrum, args.plot, args.force)
        note(args, f"wrote {args.plot}: eigenvalue spectrum of K_SS ({spectrum.numel()} eigenvalues)")
    if args.json:
        print(json_text(report))
        return 0
    print(f"{args.artifact}: {len(meta['classes'])} classes × K={report['n_support']}, {report['kernel']} kernel, "
          f"σ={report['sigma']:.4g}" + (f" (measured on {report['classes_measured']} classes)" if report["subset"] else "")
          + (" — the generated text kernel; the deployed one is described below" if report["deployed"] else ""))
    rows = [("kernel-target alignment", f"{report['alignment']:.4f}"),
            ("off-diagonal kernel mean ± std", f"{report['offdiag_mean']:.4g} ± {report['offdiag_std']:.3g}"),
            ("condition number", f"{report['condition_number']:.4g}"),
            ("effective rank", f"{report['effective_rank']:.1f} of {report['classes_measured'] * report['n_support']}"),
            ("within-class cos", "n/a (K=1)" if report["within_class_cos"] is None else f"{report['within_class_cos']:.4f}")]
    if geometry:
        rows.append(("text metric", f"κ={geometry.get('kappa', 1.0):.4g}, {geometry.get('linear_head', 'lda')} "
                                    f"linear head — {geometry.get('reason', '')}"))
    for name, value in rows:
        print(f"  {name:<32} {value}")
    halves = pool_evidence(meta.get("transductive")) is Evidence.HALVES
    for line in describe_deployed(report["deployed"], halves) if report["deployed"] else ():
        print(line)
    print("findings:" if report["findings"] else "findings: none — the kernel looks healthy")
    for f in report["findings"]:
        print(f"  - {f}")
    return 0


def _check_plot(path, force: bool):
    """Everything about ``--plot`` that can fail, before any work: suffix, folder, --force, matplotlib."""
    from pathlib import Path

    from svgen.errors import SvgenError
    from svgen.commands._images import check_out

    if Path(path).suffix.lower() != ".png":
        raise SvgenError(f"--plot {path}: the spectrum is written as PNG; give a file name ending in .png")
    check_out(path, force)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SvgenError("--plot needs matplotlib: pip install 'svgen[plot]'") from None
    return plt


def _plot(plt, spectrum, path, force: bool) -> None:
    from svgen.safeio import atomic_file

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.semilogy(spectrum.clamp_min(1e-16).numpy())
    ax.set_xlabel("index")
    ax.set_ylabel("eigenvalue of K_SS")
    ax.set_title("kernel spectrum")
    fig.tight_layout()
    try:
        atomic_file(path, lambda p: fig.savefig(p, format="png"), force=force)
    finally:
        plt.close(fig)
