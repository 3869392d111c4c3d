"""Probabilities from every head: temperatures from the text side and from held-out shots."""


def __getattr__(name):
    """What ``svgen.calibration`` held when it was one module, read lazily from where it lives now; a submodule by name."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    for module in ('svgen.calibration.temperatures',):
        value = getattr(importlib.import_module(module), name, None)
        if value is not None:
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
