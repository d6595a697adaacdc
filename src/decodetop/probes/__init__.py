"""Provides the probe protocol, results and controller (no torch here); torch lives in `probes.worker` only."""
