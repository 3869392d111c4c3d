"""svgen: support vector generation — CLIP's zero-shot classifier as a kernel machine.

:class:`SVGClassifier` is the estimator. The package tree is the architecture (``docs/architecture.md``): the math in
:mod:`svgen.core` and :mod:`svgen.zeroshot`, the heads in :mod:`svgen.heads`, adaptation to labelled shots and
unlabelled pools in :mod:`svgen.adapt`, files in :mod:`svgen.io`, the encoder in :mod:`svgen.encoders`.
"""

import importlib
import importlib.util
import logging
import os

from svgen.errors import SvgenError

# OpenMP threads that spin while they wait turn small LAPACK calls (eigvalsh of a 512×512 matrix)
# from 0.05 s into 20 s when the CPU cores are shared (measured on the 2-core benchmark machine);
# passive waiting costs nothing measurable in GEMM. Only takes effect if torch is not imported yet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["AdaptConfig", "SVGClassifier", "SvgenError", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name):
    # Imported lazily so that `svgen --help` and fast-failing commands never wait for torch.
    if name == "SVGClassifier":
        from svgen.classifier import SVGClassifier

        return SVGClassifier
    if name == "AdaptConfig":
        from svgen.adapt.config import AdaptConfig

        return AdaptConfig
    raise AttributeError(f"module 'svgen' has no attribute {name!r}")


def moved_attributes(package: str, modules: tuple):
    """A module ``__getattr__`` for a package that took the name of a module of the flat layout: a submodule by
    name, else what the old module held, read lazily from ``modules`` where it lives now (so importing a sibling
    never loads torch or open_clip through the package)."""

    def __getattr__(name):
        if importlib.util.find_spec(f"{package}.{name}") is not None:
            return importlib.import_module(f"{package}.{name}")
        for module in modules:
            value = getattr(importlib.import_module(module), name, None)
            if value is not None:
                return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
