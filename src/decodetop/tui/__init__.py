"""Provides the Textual app (the only package besides `themes` that imports textual)."""
