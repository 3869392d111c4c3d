"""Adaptation to labelled shots and unlabelled pools: the settings, the held-out evidence, the choices, the solvers
and the stages (docs/adaptation.md)."""
