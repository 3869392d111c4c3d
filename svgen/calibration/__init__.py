"""Probabilities from every head: temperatures from the text side and from held-out shots."""
