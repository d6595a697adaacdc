"""Tests of decodetop.probes."""
