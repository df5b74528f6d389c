"""Code generation for fused tapes: the tape IR, kernel naming, layout helpers, renderers."""
