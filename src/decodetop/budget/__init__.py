"""Provides model specs, the decode-step inventory, the roofline and budget composition (stdlib only)."""
