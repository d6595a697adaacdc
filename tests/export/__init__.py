"""Tests of decodetop.export."""
