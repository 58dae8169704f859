"""The one exception type for bad user input.

Anything a user can get wrong (an option, a value, a combination, a run
directory, a checkpoint file) raises `UsageError` before any work starts. The
CLI prints its message on one line and exits with status 2; the Python API lets
it propagate.
"""


class UsageError(ValueError):
    """Invalid user input; the message names the problem and what is allowed."""
