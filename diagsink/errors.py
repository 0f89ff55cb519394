"""The package's error types.

Every error raised on bad input names the problem *and* the fix. The command line
prints these without a traceback and exits with status 2.
"""

from __future__ import annotations

__all__ = ["DiagsinkError", "DataError", "ConfigError"]


class DiagsinkError(Exception):
    """Base class: a problem the user can fix (the message says how)."""


class DataError(DiagsinkError, ValueError):
    """Missing, truncated, corrupt or malformed data files."""


class ConfigError(DiagsinkError, ValueError):
    """An unknown variant/protocol, a misspelt config key, an impossible setting."""
