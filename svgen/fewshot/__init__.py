"""Labelled images (shots): the LDA head, the residual kernel ridge head, and the shots stage."""
