"""Provides decodetop's built-in themes as data."""
