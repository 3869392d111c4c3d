"""Text and images in: the open_clip encoder, weights look-ups, prompts, prototypes, encoder checks."""


def __getattr__(name):
    """What ``svgen.encoders`` held when it was one module, read lazily from where it lives now; a submodule by name."""
    import importlib
    import importlib.util

    if importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    for module in ('svgen.encoders.clip', 'svgen.encoders.activation', 'svgen.encoders.identity', 'svgen.encoders.images'):
        value = getattr(importlib.import_module(module), name, None)
        if value is not None:
            return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
