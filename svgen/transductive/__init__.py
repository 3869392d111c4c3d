"""Unlabelled images (a pool): the transductive solve, the held-out check, and what a pool keeps."""


def __getattr__(name):
    """What ``svgen.transductive`` held when it was one module, read lazily from where it lives now; a submodule by name."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    for module in ('svgen.transductive.solve',):
        value = getattr(importlib.import_module(module), name, None)
        if value is not None:
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
