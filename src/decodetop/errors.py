"""Provides the error types that reach the user as one clear line (stdlib only)."""

from __future__ import annotations


class DecodetopError(Exception):
    """An error whose message is fit to show the user as it is: it names the thing and the problem."""

    exit_code: int = 1


class UserInputError(DecodetopError):
    """Bad input from the user: a flag, a file they pointed at, a value out of range. Exit code 2."""

    exit_code = 2
