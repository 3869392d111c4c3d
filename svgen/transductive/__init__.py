"""Unlabelled images (a pool): the transductive solve, the held-out check, and what a pool keeps."""
