"""Provides NVML telemetry, host readers over a root, health checks, baselines and serving-engine metrics."""
