"""``svgen diagnose``: spectrum, effective rank, condition number and plain-language findings."""

from __future__ import annotations

from svgen.commands._common import HEAD_CHOICES, HelpFormatter, json_text, note


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
    p.add_argument("--confusions", action="store_true",
                   help="instead: the class pairs a → b the classifier is most likely to confuse, from the kernel "
                        "head's support vectors alone (the mean probability the head gives b at the support vectors "
                        "of a; docs/usage.md); --plot then draws a heat map of the classes of the top pairs")
    p.add_argument("--top", type=int, metavar="N", help="with --confusions: list this many pairs (default 20)")
    p.add_argument("--head", choices=HEAD_CHOICES, default=None,
                   help="with --confusions: the head whose confusions are predicted (default: the artifact's default "
                        "head, as 'classify' and 'eval --confusions')")
    p.set_defaults(func=run)


def run(args) -> int:
    from svgen.io.artifacts import load_artifact
    from svgen.evaluation.diagnostics import diagnose
    from svgen.errors import SvgenError

    if args.max_classes < 2:
        raise SvgenError(f"--max-classes must be at least 2, got {args.max_classes}")
    for given, flag in ((args.top, "--top"), (args.head, "--head")):
        if given is not None and not args.confusions:
            raise SvgenError(f"{flag} goes with --confusions")
    plt = _check_plot(args.plot, args.force) if args.plot else None
    if args.confusions:
        return _confusions(args)
    meta, t = load_artifact(args.artifact)
    # format 2 (images added): the generated text support vectors are what this diagnoses
    report = diagnose(t.get("text.support_vectors", t["support_vectors"]), float(t.get("text.bandwidth", t["bandwidth"])),
                      meta.get("kernel", "rbf"), args.max_classes, prototypes=t["prototypes"], classes=meta["classes"])
    spectrum = report.pop("spectrum")
    geometry = (meta.get("metrics") or {}).get("geometry")
    report["geometry"] = geometry  # the text-metric decision made at fit time (None: older artifact)
    from svgen.evaluation.diagnostics import deployed_kernel, describe_deployed
    from svgen.io import recorded

    report["deployed"] = deployed_kernel(meta, t)  # None: the text kernel measured here is the one deployed
    from svgen.evaluation.heldout import findings as head_findings

    shots, pool = recorded.shots(meta.get("fewshot")), recorded.pool(meta.get("transductive"))   # typed, once
    report["findings"] += head_findings(meta.get("fewshot"), shots)   # a selectable head worse than zero-shot
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
    for line in describe_deployed(report["deployed"], shots, pool) if report["deployed"] else ():
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
        raise SvgenError(f"--plot {path}: the plot is written as PNG; give a file name ending in .png")
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


def _confusions(args) -> int:
    """``--confusions``: the top predicted pairs as a table or JSON, and their heat map with ``--plot``."""
    from svgen import SVGClassifier
    from svgen.errors import SvgenError
    from svgen.evaluation.confusions import SCORE, predicted_pairs, support_confusion
    from svgen.heads.predictor import check_head

    top = 20 if args.top is None else args.top
    if top < 1:
        raise SvgenError(f"--top must be at least 1, got {top}")
    clf = SVGClassifier.load(args.artifact)
    head = check_head(clf.heads_, args.head or clf.default_head_)   # a head the artifact lacks: one line, no work
    names = list(clf.class_names_)
    pairs = predicted_pairs(clf, top, head=head)
    if args.plot:
        from svgen.evaluation.plots import plot_confusions

        shown = list(dict.fromkeys(c for p in pairs for c in (p.a, p.b)))
        table = support_confusion(clf, shown, head=head)[:, shown].numpy()
        plot_confusions({f"conf(a → b), the top {len(pairs)} pairs' classes": table}, [names[c] for c in shown],
                        args.plot, title=f"{args.artifact}: predicted confusions", force=args.force)
        note(args, f"wrote {args.plot}: heat map of the {len(shown)} classes of the top {len(pairs)} pairs")
    if args.json:
        print(json_text({"score": SCORE.format(head=head), "head": head, "classes": len(names),
                         "pairs": [p.to_json(names, rank=r) for r, p in enumerate(pairs, 1)]}))
        return 0
    print(f"{args.artifact}: the {len(pairs)} class pairs the {head} head is most likely to confuse "
          f"({SCORE.format(head=head)})")
    width = max([len(str(names[p.a])) for p in pairs] + [10])
    print(f"  {'rank':>4}  {'true class a':<{width}}  {'taken for b':<{width}}  {'conf(a → b)':>11}")
    for r, p in enumerate(pairs, 1):
        print(f"  {r:>4}  {str(names[p.a]):<{width}}  {str(names[p.b]):<{width}}  {p.score:>11.4g}")
    return 0
