"""Text and images in: the open_clip encoder, weights look-ups, prompts, prototypes, encoder checks."""

from svgen import moved_attributes

# what svgen.encoders held as one module
__getattr__ = moved_attributes(__name__, ("svgen.encoders.clip", "svgen.encoders.activation",
                                          "svgen.encoders.identity", "svgen.encoders.images"))
