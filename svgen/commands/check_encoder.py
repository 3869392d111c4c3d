"""``svgen check-encoder``: compare an encoder's embeddings with OpenAI CLIP ViT-B/32's reference outputs."""

from __future__ import annotations

from svgen.errors import SvgenError
from svgen.commands._common import ExamplesFormatter, add_encoder_args, default_pretrained, load_encoder


def add_parser(sub):
    p = sub.add_parser(
        "check-encoder",
        help="check that an encoder reproduces OpenAI CLIP ViT-B/32's embeddings (activation, preprocessing, weights)",
        description="Encode \"a diagram\", \"a dog\", \"a cat\" and CLIP's overview figure (CLIP.png) with the encoder and compare "
                    "them with OpenAI CLIP ViT-B/32's published embeddings (shipped with svgen; NumPyCLIP, MIT). "
                    "Prints the cosine per vector and a verdict: every cosine >= 0.999 passes; on a failure it "
                    "re-encodes with the other MLP activation and with CLIP's own preprocessing and says which "
                    "mistake is likely (GELU/QuickGELU mix-up, wrong preprocessing, or wrong weights). "
                    "Only OpenAI's ViT-B-32 weights have a reference: a tag other than 'openai' or another "
                    "architecture is reported as having none.",
        epilog="exit status: 0 pass, 1 fail, 2 no reference for this model or bad input.\n\n"
               "examples:\n"
               "  svgen check-encoder                       # ViT-B-32, pretrained openai (the default)\n"
               "  svgen check-encoder --checkpoint ViT-B-32.safetensors --quick-gelu",
        formatter_class=ExamplesFormatter,
    )
    add_encoder_args(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from svgen.encoders import check
    from svgen.encoders.activation import activation_name

    pretrained = default_pretrained(args)
    if pretrained:  # decided before any weights are loaded: another tag has no reference
        applies, what = check.reference_applies(args.model, pretrained)
        if not applies:
            raise SvgenError(_no_reference(what))
    encoder = load_encoder(args)
    if not pretrained:
        applies, what = check.reference_applies(encoder.model_name, None)
        if not applies:
            raise SvgenError(_no_reference(what))
    reference = check.shipped_reference()
    result = check.check_encoder(encoder, reference)
    source = f"pretrained '{pretrained}'" if pretrained else (encoder.identity()["checkpoint"] or "")
    print(f"encoder: {encoder.model_name} {source}".rstrip()
          + f", {activation_name(encoder.quick_gelu)} ({encoder.quick_gelu_reason})")
    print(f"reference: {reference.name}, {reference.source}")
    for label, cos in zip(result.labels, result.cosines):
        mark = "ok" if cos >= result.threshold else "FAIL"
        print(f"  cosine {cos:.6f}  {mark:4}  {label}")
    print(("PASS: " if result.passed else "FAIL: ") + result.verdict)
    return 0 if result.passed else 1


def _no_reference(what: str) -> str:
    return (f"no reference embeddings ship for {what}; check-encoder knows OpenAI CLIP ViT-B/32 only "
            "(--model ViT-B-32 --pretrained openai, or ViT-B-32 weights via --checkpoint, hf-hub: or local-dir:)")
