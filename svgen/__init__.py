"""svgen: support vector generation — CLIP's zero-shot classifier as a kernel machine.

:class:`SVGClassifier` is the estimator. The package tree is the architecture (``docs/architecture.md``): the math in
:mod:`svgen.core` and :mod:`svgen.zeroshot`, the heads in :mod:`svgen.heads`, labelled and unlabelled images in
:mod:`svgen.fewshot` and :mod:`svgen.transductive`, files in :mod:`svgen.io`, the encoder in :mod:`svgen.encoders`.
Modules that moved there keep their old import paths (``svgen.artifacts`` …) with a deprecation warning.
"""

import importlib
import importlib.abc
import importlib.util
import logging
import os
import sys
import warnings

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
        from svgen.selection import AdaptConfig

        return AdaptConfig
    raise AttributeError(f"module 'svgen' has no attribute {name!r}")


# Old import paths of modules that moved, and where they live now: ``import svgen.artifacts`` still works, warns once,
# and gives the module itself (the same object as ``svgen.io.artifacts``).
MOVED = {
    "svgen.kernels": "svgen.core.kernels",
    "svgen.generator": "svgen.core.generator",
    "svgen.losses": "svgen.core.losses",
    "svgen.metric": "svgen.core.metric",
    "svgen.support": "svgen.core.support",
    "svgen.scale": "svgen.core.scale",
    "svgen.training": "svgen.zeroshot.training",
    "svgen.predictor": "svgen.heads.predictor",
    "svgen.residual": "svgen.fewshot.residual",
    "svgen.shot_adapt": "svgen.fewshot.adapt",
    "svgen.pool_solve": "svgen.transductive.pool",
    "svgen.pool_gate": "svgen.transductive.gate",
    "svgen.pool_adapt": "svgen.transductive.adapt",
    "svgen.io.safeio": "svgen.safeio",
    "svgen.artifacts": "svgen.io.artifacts",
    "svgen.schema": "svgen.io.schema",
    "svgen.codec": "svgen.io.codec",
    "svgen.export": "svgen.io.export",
    "svgen.output": "svgen.io.output",
    "svgen.data": "svgen.io.data",
    "svgen.hub": "svgen.encoders.hub",
    "svgen.prompts": "svgen.encoders.prompts",
    "svgen.prototypes": "svgen.encoders.prototypes",
    "svgen.check": "svgen.encoders.check",
    "svgen.blocks": "svgen.engine.blocks",
    "svgen.ray_engine": "svgen.engine.ray",
    "svgen.metrics": "svgen.evaluation.metrics",
    "svgen.diagnostics": "svgen.evaluation.diagnostics",
    "svgen.calibration.plots": "svgen.evaluation.plots",
    "svgen.fewshot.select": "svgen.selection",
    "svgen.fewshot.loo": "svgen.fewshot.lda",
    "svgen.calibration.mixture": "svgen.calibration.temperatures",
    "svgen.fewshot.linear": "svgen.fewshot.lda",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {MOVED[spec.name]}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module):
        pass


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.append(_MovedModules())


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
