"""Provides profiler-trace reading, decode-step segmentation and kernel attribution (stdlib only)."""
