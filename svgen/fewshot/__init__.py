"""Labelled images (shots): the LDA head, the residual kernel ridge head, and the shots stage."""

from svgen import moved_attributes

__getattr__ = moved_attributes(__name__, ("svgen.fewshot.lda",))   # what svgen.fewshot held as one module
