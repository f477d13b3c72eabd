"""Benchmarks of tfdp_embed (protocol: ../shared/BENCHMARKS.md; results: benchmarks/RESULTS.md)."""
