"""Provides the subcommands of the `decodetop` CLI, one module each (imported lazily by `decodetop.cli`)."""
