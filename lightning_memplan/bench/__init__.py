"""Benchmarks shipped with the package (``memplan bench``): ours vs torch, side by side."""
