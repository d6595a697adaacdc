"""Tests of decodetop.commands, each subcommand end to end."""
