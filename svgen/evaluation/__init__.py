"""Judging a classifier: metrics over score matrices and the kernel's diagnostics."""
