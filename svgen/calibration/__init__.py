"""Probabilities from every head: temperatures from the text side and from held-out shots."""

from svgen import moved_attributes

__getattr__ = moved_attributes(__name__, ("svgen.calibration.temperatures", "svgen.evaluation.metrics", "svgen.evaluation.plots"))   # what svgen.calibration held as one module
