"""Benchmarks of the Python package (python3 -m strata.bench.peers)."""
