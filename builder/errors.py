"""Errors a user can cause: printed as one line, never as a traceback."""


class UserError(Exception):
    """Bad input (matrix, arguments, missing tool): exit status 2."""

    exit_code = 2


class BuildFailure(Exception):
    """A build, patch or test step failed: exit status 1."""

    exit_code = 1
