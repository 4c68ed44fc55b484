"""Benchmarks: scripts that print figures and write them as JSON under bench/results/."""
