"""``svgen eval``: accuracy of the cosine, kernel and linear heads side by side."""

from __future__ import annotations

import logging

from svgen.errors import SvgenError
from svgen.steps import timed
from svgen.commands._common import ExamplesFormatter, json_text, note
from svgen.commands._shots import load_named_labels
from svgen.commands._images import add_image_encoder_args, check_out, emit, encode_paths, encoder_for_artifact, load_features

from svgen.evaluation.metrics import HEAD_ORDER, evaluate_heads

log = logging.getLogger(__name__)


def add_parser(sub):
    p = sub.add_parser(
        "eval",
        help="accuracy of every head (cosine, kernel, linear; mixture after shots) on labelled images or embeddings",
        description="Evaluate the cosine (plain CLIP), kernel-vote and linear heads of an artifact on the same "
                    "labelled data and print one table: top-1 and top-5 accuracy, mean per-class recall (over "
                    "the classes present in the labels) and the number of examples evaluated. --data DIR is a "
                    "torchvision ImageFolder (one sub-folder per class, named after the class) or a folder with "
                    "labels.csv of file,class rows; --features/--labels are N×D embeddings and N class names or "
                    "indices into the artifact's class list. The probabilities of every head (softmax(logits / T), T "
                    "stored in the artifact) are judged by nll (mean −log p of the true class) and ece "
                    "(expected calibration error over 15 equal-width confidence bins); T is each head's "
                    "temperature. After labelled shots the table has a fourth head, their mixture (the kernel "
                    "and linear heads' probabilities averaged with the weight the fit chose; T = 1); '*' marks the "
                    "default head, the one classify, export and predict use. After labelled shots, a head --head can "
                    "select that the fit's own held-out shots found worse than zero-shot (the cosine head) is named "
                    "in a warning on stderr (svgen.json fewshot.heads_vs_zero_shot).",
        epilog="examples:\n"
               "  svgen eval lvis.svgen --features dev_feats.npy --labels dev_labels.npy\n"
               "  svgen eval pets.svgen --data pets-val/ --json --out pets-eval.json\n"
               "  svgen eval lvis.svgen --features dev_feats.npy --labels dev_labels.npy --plot reliability.png",
        formatter_class=ExamplesFormatter,
    )
    p.add_argument("artifact", metavar="ARTIFACT_DIR", help="artifact written by 'svgen fit'")
    src = p.add_argument_group("data (one of)")
    src.add_argument("--data", metavar="DIR", help="labelled image folder: ImageFolder layout or DIR/labels.csv")
    src.add_argument("--features", metavar="FEATS.npy", help="N×D image embeddings")
    src.add_argument("--labels", metavar="LABELS.npy",
                     help="N integer class indices, or N class names (a str array) (with --features)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object {head: {acc1, acc5, mean_per_class_recall, nll, ece, temperature, n}} "
                        "instead of a table (implied by --out FILE.json)")
    p.add_argument("--plot", metavar="FILE.png",
                   help="also draw reliability diagrams of the heads side by side (needs svgen[plot]; "
                        "--force replaces an existing file)")
    p.add_argument("--out", metavar="FILE",
                   help="write here (atomically) instead of stdout: FILE.json gets the JSON object, FILE.txt "
                        "(or any other name) the table; --json with a .txt name is refused; '-' is stdout")
    p.add_argument("--force", action="store_true",
                   help="overwrite --out and --plot if they exist (only a regular file is replaced: never a "
                        "symbolic link, device or FIFO)")
    p.add_argument("--confusions", action="store_true",
                   help="also list the 20 most frequent (true, predicted) class pairs of the default head on these "
                        "data beside the pairs 'svgen diagnose --confusions' predicts from the support vectors, "
                        "ranked by the rows they expect on these labels (rows of a × conf(a → b)), marking the "
                        "measured pairs among the top 100 predicted (JSON: key confusions); with --plot "
                        "also a heat map of them, FILE_confusions.png")
    add_image_encoder_args(p)
    p.set_defaults(func=run, derived_outputs=derived_outputs)


def derived_outputs(args) -> list:
    """The output named after another, checked with --out and --plot before any work (``check_outputs``): the
    ``--confusions --plot`` heat map."""
    return [("--plot's heat map", _confusions_png(args.plot))] if args.confusions and args.plot else []


def format_table(results: dict, default_head: str = "kernel") -> str:
    """The heads side by side; ``*`` marks the default head (the one classify, export and predict use)."""
    lines = [f"{'head':<8} {'acc1':>8} {'acc5':>8} {'mean_per_class_recall':>22} {'nll':>7} {'ece':>7} "
             f"{'T':>9} {'n':>7}"]
    for head in (h for h in HEAD_ORDER if h in results):
        r = results[head]
        name = head + ("*" if head == default_head else "")
        lines.append(f"{name:<8} {100 * r['acc1']:>7.2f}% {100 * r['acc5']:>7.2f}% "
                     f"{100 * r['mean_per_class_recall']:>21.2f}% {r['nll']:>7.3f} {r['ece']:>7.4f} "
                     f"{r['temperature']:>9.4g} {r['n']:>7d}")
    return "\n".join(lines) + "\n"


def run(args) -> int:
    from svgen import SVGClassifier

    if args.data and (args.features or args.labels):
        raise SvgenError("give --data DIR or --features with --labels, not both")
    if not args.data and not (args.features and args.labels):
        if args.features or args.labels:
            raise SvgenError("--features and --labels go together; give both")
        raise SvgenError("nothing to evaluate: give --data DIR, or --features FEATS.npy --labels LABELS.npy")
    _format_from_suffix(args)
    check_out(args.out, args.force)
    if args.plot:
        check_out(args.plot, args.force)
        if args.confusions:
            check_out(_confusions_png(args.plot), args.force)
        try:
            import matplotlib  # noqa: F401  (fail before any work)
        except ImportError:
            raise SvgenError("--plot needs matplotlib: pip install 'svgen[plot]'") from None
    with timed(log, f"loaded {args.artifact}"):
        clf = SVGClassifier.load(args.artifact)
    if args.features:
        x = load_features(args.features, clf, mmap=True)   # read block by block as it is scored
        y, by_name = load_named_labels(args.labels, clf.class_names_, "labels", "--labels")
    else:
        import numpy as np

        from svgen.io.data import labelled_images

        data = labelled_images(args.data, clf.class_names_)
        encoder = encoder_for_artifact(args, clf)
        x, ok, _ = encode_paths(args, encoder, data.paths, "eval")
        label_of = dict(zip(data.paths, data.labels))
        y = np.asarray([label_of[p] for p in ok], dtype=np.int64)
        by_name = True   # folder names or labels.csv: class names
    bins = {} if args.plot else None
    top1 = {clf.default_head_: None} if args.confusions else None   # the default head's decisions, kept for them
    results = evaluate_heads(clf, x, y, bins, progress=getattr(args, "progress", False), by_name=by_name, top1=top1)
    from svgen.evaluation.heldout import findings as head_findings

    # what the fit itself knew, whatever the data evaluated here say
    for line in head_findings(clf.fewshot_, clf.shots_outcome_):
        log.warning("%s", line)
    extra = {"confusions": confusions(args, clf, x, y, top1[clf.default_head_])} if args.confusions else {}
    text = (json_text({**results, "default_head": clf.default_head_, **extra}) + "\n" if args.json
            else format_table(results, clf.default_head_) + (format_confusions(extra["confusions"]) if extra else ""))
    if args.plot:
        from svgen.evaluation.plots import plot_reliability

        plot_reliability({h: {**results[h], "reliability": bins[h]} for h in HEAD_ORDER if h in results}, args.plot,
                         title=f"{args.artifact}: reliability ({results['cosine']['n']} examples)", force=args.force)
        note(args, f"wrote {args.plot}: reliability diagrams of the {', '.join(results)} heads")
    emit(text, args.out, args.force, args, f"{', '.join(results)} heads on {len(y)} example(s), "
                                           f"{'JSON' if args.json else 'table'}")
    return 0


def _format_from_suffix(args) -> None:
    """``--out e.json`` writes JSON (as ``--json``); ``--json --out e.txt`` is a contradiction, refused."""
    from pathlib import Path

    suffix = Path(args.out).suffix.lower() if args.out else ""
    if suffix == ".json":
        args.json = True
    elif suffix in (".txt", ".text") and args.json:
        raise SvgenError(f"--json contradicts --out {args.out} (a {suffix} file gets the table); "
                         "name it .json or drop --json")


def _confusions_png(plot) -> str:
    """Where ``--confusions --plot FILE.png`` writes the heat map: ``FILE_confusions.png`` beside it."""
    from pathlib import Path

    p = Path(plot)
    return str(p.with_name(f"{p.stem}_confusions{p.suffix}"))


def confusions(args, clf, x, y, predictions) -> dict:
    """``--confusions``: the measured pairs beside the predicted ones (:func:`svgen.evaluation.confusions.
    confusion_report`) from the default head's ``predictions`` (top-1 class and probability per row, as
    ``evaluate_heads`` scored them), and their heat map with ``--plot``."""
    import numpy as np

    from svgen.evaluation.confusions import confusion_report, support_confusion

    report = confusion_report(clf, x, y, predictions=predictions)
    if args.plot and report["measured"]:
        from svgen.evaluation.plots import plot_confusions

        shown = list(dict.fromkeys(c for m in report["measured"] for c in (m["a"], m["b"])))
        at = {c: i for i, c in enumerate(shown)}
        counts = [[0] * len(shown) for _ in shown]
        for m in report["measured"]:
            counts[at[m["a"]]][at[m["b"]]] = m["count"]
        path = _confusions_png(args.plot)
        sizes = np.bincount(np.asarray(y, dtype=np.int64), minlength=len(clf.class_names_))[shown]
        expected = support_confusion(clf, shown)[:, shown].numpy() * sizes[:, None]   # rows of a expected called b
        plot_confusions({f"measured: rows of a called b ({report['head']} head, top {len(report['measured'])})": counts,
                         "predicted from the support vectors: n_a · conf(a → b)": expected},
                        [clf.class_names_[c] for c in shown], path, title=f"{args.artifact}: confusions", force=args.force)
        note(args, f"wrote {path}: heat maps of the {len(shown)} classes of the top measured pairs")
    elif args.plot:
        note(args, f"no confusion heat map: the {report['head']} head made no error on these data")
    return report


def format_confusions(r: dict) -> str:
    """The measured pairs, '*' and the rank where they are among the top predicted, beside the predicted pairs."""
    lines = [f"\nconfusions of the {r['head']} head: {r['errors']} of {r['n']} rows wrong; the most frequent (true, "
             f"predicted) pairs, not symmetrised; '*': among the top {r['window']} pairs predicted from the support "
             f"vectors ({r['measured_in_predicted']} of {len(r['measured'])})"]
    width = max([len(str(m[k])) for m in r["measured"] for k in ("true", "predicted")] + [10])
    lines.append(f"  {'true':<{width}}  {'predicted':<{width}} {'rows':>5}  {'rank':>5}   |   predicted pairs "
                 "(rows expected, n_a · conf(a → b))")
    for i in range(max(len(r["measured"]), len(r["predicted"]))):
        m = r["measured"][i] if i < len(r["measured"]) else None
        left = (f"  {str(m['true']):<{width}}  {str(m['predicted']):<{width}} {m['count']:>5}  "
                + (f"*{m['predicted_rank']:>4}" if m["predicted_rank"] else f"{'':>5}")
                if m else " " * (2 * width + 18))
        p = r["predicted"][i] if i < len(r["predicted"]) else None
        right = f"{p['rank']:>3}. {p['true']} → {p['predicted']} ({p['expected']:.3g})" if p else ""
        lines.append(f"{left}   |   {right}".rstrip())
    return "\n".join(lines) + "\n"
