"""Throughput benchmarks; each script also exposes a function other benchmarks import."""
