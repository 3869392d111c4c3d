"""svgen: support vector generation — CLIP's zero-shot classifier as a kernel machine.

The method in a few files: :mod:`svgen.core.generator` (the MLP), :mod:`svgen.core.kernels`,
:mod:`svgen.core.losses`, :mod:`svgen.heads.scoring`, :mod:`svgen.zeroshot.training`; :class:`SVGClassifier` is the
estimator; :mod:`svgen.encoders.clip` and :mod:`svgen.encoders.prototypes` turn class names into prototypes.
"""

import logging
import os

from svgen.errors import SvgenError

# OpenMP threads that spin while they wait turn small LAPACK calls (eigvalsh of a 512×512 matrix)
# from 0.05 s into 20 s when the CPU cores are shared (measured on the 2-core benchmark machine);
# passive waiting costs nothing measurable in GEMM. Only takes effect if torch is not imported yet.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
__all__ = ["SVGClassifier", "SvgenError", "__version__"]

logging.getLogger(__name__).addHandler(logging.NullHandler())


def __getattr__(name):
    # Imported lazily so that `svgen --help` and fast-failing commands never wait for torch.
    if name == "SVGClassifier":
        from svgen.classifier import SVGClassifier

        return SVGClassifier
    raise AttributeError(f"module 'svgen' has no attribute {name!r}")
