"""Provides the host and GPU health checks (see docs/architecture.md, "Health checks")."""
