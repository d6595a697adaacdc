"""Tests of decodetop.budget."""
