"""Reproducible benchmarks of the engine (``cayuga bench ...``); see BENCHMARKS.md."""
