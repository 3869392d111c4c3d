"""Prompt templates and class lists shipped with svgen (installed as ``svgen._prompts``)."""
