"""The solvers of the adaptation: closed forms that fit a head and score held-out shots, and decide nothing (the
choices are :mod:`svgen.adapt.select`'s). They import only :mod:`svgen.core` and :mod:`svgen.errors`."""
