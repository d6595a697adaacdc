"""Tests of decodetop.pipeline."""
