"""The heads (kernel vote, linear, cosine): their scores, logits and probabilities."""

from svgen import moved_attributes

__getattr__ = moved_attributes(__name__, ("svgen.heads.scoring",))   # what svgen.heads held as one module
