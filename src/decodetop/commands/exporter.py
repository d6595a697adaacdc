"""Provides `decodetop exporter` (placeholder until its issue lands)."""

from __future__ import annotations

import argparse

from decodetop.errors import DecodetopError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Register this command's flags."""


def run(args: argparse.Namespace) -> int:
    """Run the command."""
    raise DecodetopError("'exporter' is not implemented yet")
