"""Tests of the benchmark scripts, on CPU."""
