"""Tests of decodetop.collectors."""
