"""Labelled images (shots): the LDA head, the residual kernel ridge head, and the shots stage."""


def __getattr__(name):
    """What ``svgen.fewshot`` held when it was one module, read lazily from where it lives now; a submodule by name."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    for module in ('svgen.fewshot.lda',):
        value = getattr(importlib.import_module(module), name, None)
        if value is not None:
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
