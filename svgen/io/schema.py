"""One schema for ``svgen.json``, checked before anything reads the artifact.

:func:`parse_meta` turns the bytes of ``svgen.json`` into a dict or one :class:`SvgenError` line: strict
JSON (no ``NaN``/``Infinity``, numbers that overflow are refused), nesting at most
:data:`MAX_DEPTH` deep. :func:`validate_meta` then checks every key svgen reads — its type, its range,
its length — so a tampered file is refused in one line instead of failing somewhere deep inside (a
traceback) or, worse, being accepted with a changed meaning (integer class names, ``format_version:
true``, a string ``vote_weights_scale`` that rescales the votes, ``quick_gelu: "yes"``).

Keys svgen does not know are allowed (an artifact may carry notes); the open records it writes for
people (``metrics``, ``fewshot``, ``transductive``, ``calibration``) are checked where svgen reads
them and otherwise only for being JSON objects.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from typing import Callable, Dict, Optional

from svgen.config import KERNELS, MAX_WEIGHT, FitConfig
from svgen.errors import SvgenError
from svgen.adapt.heldout import METRICS, ZERO_SHOT
from svgen.heads.scoring import HEADS, MIXTURE

MAX_DEPTH = 32                  # svgen.json nests 3 deep; anything far deeper is not an svgen file
MAX_CLASSES = 10_000_000
MAX_NAME_CHARS = 4096           # a class name or a template
MAX_DIM = 1 << 16               # embedding dimension


class _Bad(Exception):
    pass


def _reject_constant(name):
    raise _Bad(f"holds {name}, which is not JSON; svgen writes strict JSON")


def _finite_float(text):
    value = float(text)
    if not math.isfinite(value):
        raise _Bad(f"holds the number {text[:40]}, which overflows")
    return value


def parse_meta(data: bytes, where) -> dict:
    """Strict JSON of ``svgen.json``'s bytes as a dict, or one :class:`SvgenError` line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SvgenError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        meta = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    except _Bad as e:
        raise SvgenError(f"{where} {e}") from None
    except RecursionError:
        raise SvgenError(f"{where} is nested too deeply to be an svgen.json") from None
    except json.JSONDecodeError as e:
        raise SvgenError(f"{where} is not valid JSON ({e})") from None
    except ValueError as e:  # an integer of more digits than Python converts (sys.set_int_max_str_digits)
        raise SvgenError(f"{where} is not a valid svgen.json ({(str(e).splitlines() or [''])[0][:200]})") from None
    if not isinstance(meta, dict):
        raise SvgenError(f"{where} must hold a JSON object, got {_kind(meta)}")
    _check_depth(meta, where)
    return meta


def _check_depth(obj, where) -> None:
    stack = [(obj, 1)]
    while stack:
        o, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise SvgenError(f"{where} is nested more than {MAX_DEPTH} levels deep; not an svgen.json")
        if isinstance(o, dict):
            stack.extend((v, depth + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, depth + 1) for v in o)


# ----------------------------------------------------------------------------- value checks

def _kind(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) and math.isfinite(v)


def _expect(ok: bool, key: str, want: str, v) -> None:
    if not ok:
        raise _Bad(f"'{key}' must be {want}, got {_kind(v)}" + (f" {v!r}" if _is_num(v) or isinstance(v, str)
                                                                and len(v) < 40 else ""))


def integer(lo=None, hi=None) -> Callable:
    def check(key, v):
        _expect(_is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi), key,
                "an integer" + _range(lo, hi), v)
    return check


def number(lo=None, hi=None, positive=False) -> Callable:
    def check(key, v):
        ok = _is_num(v) and (lo is None or v >= lo) and (hi is None or v <= hi) and (not positive or v > 0)
        _expect(ok, key, ("a positive number" if positive else "a finite number") + _range(lo, hi), v)
    return check


def _range(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo:g}, {hi:g}]"
    if lo is not None:
        return f" >= {lo:g}"
    if hi is not None:
        return f" <= {hi:g}"
    return ""


def string(max_len=MAX_NAME_CHARS, choices=None) -> Callable:
    def check(key, v):
        if choices is not None:
            _expect(isinstance(v, str) and v in choices, key, "one of " + ", ".join(map(repr, choices)), v)
        _expect(isinstance(v, str) and len(v) <= max_len, key, f"a string of at most {max_len} characters", v)
    return check


def boolean(key, v):
    _expect(isinstance(v, bool), key, "true or false", v)


def anything(key, v):
    pass


def optional(check: Callable) -> Callable:
    def opt(key, v):
        if v is not None:
            check(key, v)
    return opt


def either(*checks: Callable, want: str) -> Callable:
    def check(key, v):
        for c in checks:
            try:
                c(key, v)
                return
            except _Bad:
                pass
        raise _Bad(f"'{key}' must be {want}, got {_kind(v)}")
    return check


def list_of(item: Callable, min_len=0, max_len=MAX_CLASSES, unique=False) -> Callable:
    def check(key, v):
        _expect(isinstance(v, list) and min_len <= len(v) <= max_len, key,
                f"a list of {min_len} to {max_len} entries", v)
        for i, x in enumerate(v):
            item(f"{key}[{i}]", x)
        if unique and len(set(v)) != len(v):
            seen = set()
            dup = next(x for x in v if x in seen or seen.add(x))
            raise _Bad(f"'{key}' names {dup!r} twice")
    return check


def obj(spec: Optional[Dict[str, Callable]] = None, values: Optional[Callable] = None, required=()) -> Callable:
    """A JSON object with the ``required`` keys, whose known keys follow ``spec`` (others are allowed,
    or checked by ``values``)."""
    def check(key, v):
        _expect(isinstance(v, dict), key, "a JSON object", v)
        for k in required:
            if k not in v:
                raise _Bad(f"'{key}' lacks '{k}'")
        for k, x in v.items():
            c = (spec or {}).get(k, values)
            if c is not None:
                c(f"{key}.{k}", x)
    return check


# ----------------------------------------------------------------------------- the schema

def _fit_field(f) -> Callable:
    """The check of one :class:`~svgen.config.FitConfig` field, from its default's type (ranges are
    :meth:`FitConfig.validate`'s job, run right after)."""
    name, default = f.name, f.default
    if name == "ridge":
        return either(string(choices=("auto", "loo", "gcv")), number(positive=True), want="'auto', 'loo', 'gcv' "
                                                                                         "or a positive number")
    if name == "rff_dim":
        return optional(integer(1))
    if isinstance(default, bool):
        return boolean
    if isinstance(default, int):
        return integer()
    if isinstance(default, float):
        return number()
    if isinstance(default, str):
        return string()
    return anything


FIT_SPEC = {f.name: _fit_field(f) for f in fields(FitConfig)}

ROUNDING = 1e-9   # a weighted mean of 0/1 hits may land a few ulps outside [0, 1], an NLL a few below 0


def _share(key, v):
    _expect(_is_num(v) and -ROUNDING <= v <= 1 + ROUNDING, key, "a number in [0, 1]", v)


def _nll(key, v):
    _expect(_is_num(v) and v >= -ROUNDING, key, "a number >= 0", v)


_HEAD_METRICS = obj({"acc1": _share, "acc5": _share, "nll": _nll}, required=METRICS)
_DIFFERENCE = obj({"difference": number(), "standard_error": number(0)}, required=("difference", "standard_error"))
_HEADS_RECORD = obj({"images": integer(1), "heads": obj(values=_HEAD_METRICS, required=(ZERO_SHOT,)),
                     "versus_zero_shot": optional(obj(values=obj(values=_DIFFERENCE))),
                     "worse_than_zero_shot": obj(values=list_of(string(choices=METRICS), min_len=1,
                                                                max_len=len(METRICS), unique=True)),
                     "rule": optional(string())},
                    required=("images", "heads", "worse_than_zero_shot"))


def heads_vs_zero_shot(key, v):
    """``fewshot.heads_vs_zero_shot`` (:func:`svgen.adapt.heldout.compare`), which ``diagnose`` and ``eval`` report
    (:func:`svgen.evaluation.heldout.findings`): every head it names is one of svgen's, and every head called worse
    than zero-shot is scored beside the cosine head."""
    _HEADS_RECORD(key, v)
    known = (*HEADS, MIXTURE)
    for part in ("heads", "versus_zero_shot", "worse_than_zero_shot"):
        for head in v.get(part) or {}:
            if head not in known:
                raise _Bad(f"'{key}.{part}' names {head!r}, which is not a head (" + ", ".join(known) + ")")
    for head in v["worse_than_zero_shot"]:
        if head == ZERO_SHOT or head not in v["heads"]:
            raise _Bad(f"'{key}.worse_than_zero_shot' names {head!r}, which '{key}.heads' does not compare "
                       "with zero-shot")

ENCODER_SPEC = {
    "model": optional(string()), "pretrained": optional(string()), "checkpoint": optional(string()),
    "checkpoint_sha256": optional(string(max_len=128)), "quick_gelu": optional(boolean),
    "embed_dim": optional(integer(1, MAX_DIM)), "source": optional(string()), "file": optional(string()),
    "images": optional(obj({"model": optional(string()), "pretrained": optional(string()),
                            "checkpoint": optional(string()), "checkpoint_sha256": optional(string(max_len=128)),
                            "quick_gelu": optional(boolean), "embed_dim": optional(integer(1, MAX_DIM))})),
}

SCHEMA: Dict[str, Callable] = {
    "classes": list_of(string(), min_len=2),   # repeated names are allowed (ImageNet's list has two pairs)
    "n_support": integer(1),
    "kernel": string(choices=KERNELS),
    "dim": integer(1, MAX_DIM),
    "encoder": optional(obj(ENCODER_SPEC)),
    "templates": optional(list_of(string(), min_len=1)),
    "fit": optional(obj(FIT_SPEC)),
    "metrics": optional(obj({"ridge_lambda": optional(number(hi=MAX_WEIGHT, positive=True)), "geometry": optional(obj()),
                             "scale": optional(obj()), "sigma": optional(number())})),
    "vote_weights_scale": optional(obj({"factor": number(positive=True), "rule": optional(string()),
                                        "applied_on_load": optional(boolean)},
                                       required=("factor",))),
    "calibration": optional(obj({"method": optional(string()),
                                 "temperatures": optional(obj(values=number(positive=True))),
                                 "mixture_weight": optional(number(0, 1)),
                                 "shotless_offset": optional(number(0)),
                                 "pool_factor_powers": optional(obj())})),
    "support_source": optional(obj(values=string())),
    "support_origin": optional(obj({"image": optional(list_of(obj({"path": string(), "file": string(),
                                                                    "row": integer(0)})))})),
    "kernel_prior": optional(obj({"kind": optional(string(choices=("cosine-softmax",))),
                                  "logit_scale": number(positive=True)}, required=("logit_scale",))),
    "fewshot": optional(obj({"linear": optional(obj({"shrinkage": optional(number(0, 1))})),
                             "default_head": optional(string(choices=("kernel", "linear", "mixture"))),
                             "kernel": optional(obj()), "shots": optional(integer(0)),
                             "classes_with_shots": optional(integer(0)),
                             "heads_vs_zero_shot": optional(heads_vs_zero_shot)})),
    "lda": optional(obj({"shrinkage": number(0, 1), "temperature": optional(number(positive=True))},
                        required=("shrinkage",))),
    "transductive": optional(obj({"fallback": optional(string(max_len=4096)), "pool": optional(integer(0)),
                                  "inductive_calibration": optional(obj())})),
    "vote_weights": optional(obj({"layout": string(choices=("coo",)),
                                  "shape": list_of(integer(1), min_len=2, max_len=2), "nnz": optional(integer(0)),
                                  "tensors": optional(list_of(string()))}, required=("layout", "shape"))),
}
REQUIRED_KEYS = ("format_version", "classes")


def validate_meta(meta: dict, where, versions) -> dict:
    """Check ``meta`` against :data:`SCHEMA` and the fit settings' ranges; returns it, or raises one line.

    ``versions``: the format versions this svgen reads (:data:`svgen.io.artifacts.FORMAT_VERSIONS`)."""
    missing = [k for k in REQUIRED_KEYS if k not in meta]
    if missing:
        raise SvgenError(f"{where} lacks {', '.join(map(repr, missing))}; not an svgen artifact")
    version = meta["format_version"]
    if not _is_int(version) or version not in versions:
        raise SvgenError(f"{where} has format_version {version!r}; this svgen reads versions "
                         f"{', '.join(map(str, versions))}")
    try:
        for key, check in SCHEMA.items():
            if key in meta:
                check(key, meta[key])
    except _Bad as e:
        raise SvgenError(f"{where}: {e}") from None
    fit = meta.get("fit")
    if fit:
        known = {k: v for k, v in fit.items() if k in FIT_SPEC}
        try:
            FitConfig(**known).validate()
        except SvgenError as e:
            raise SvgenError(f"{where}: 'fit' {e}") from None
    return meta
