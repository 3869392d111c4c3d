"""Large collections: deterministic blocks of inputs and the Ray Data engine."""
