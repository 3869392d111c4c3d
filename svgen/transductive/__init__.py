"""Unlabelled images (a pool): the transductive solve, the held-out check, and what a pool keeps."""

from svgen import moved_attributes

__getattr__ = moved_attributes(__name__, ("svgen.transductive.solve",))   # what svgen.transductive held as one module
