"""Text and images in: the open_clip encoder, weights look-ups, prompts, prototypes, encoder checks."""
