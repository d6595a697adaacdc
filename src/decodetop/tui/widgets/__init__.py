"""Provides the live UI's widgets, one per module."""
