"""Benchmarks and the sweep report; each prints figures against a baseline measured in the same run."""
