"""Errors that the CLI reports as one clear line: exit code 2 for bad input, 3 for a privacy
finding."""


class UserError(Exception):
    """Bad input from the user: a malformed file, a wrong config key, too few ranks, ...

    The message must name the file, field or rank at fault. The CLI prints it on one line and
    exits with code 2; under MPI the failing rank aborts the whole job.
    """

    exit_code = 2


class DeviceOutOfMemory(UserError):
    """A model did not fit in its device's memory (CUDA out of memory).

    The message names the device and the model's size in parameters; the failing rank is named
    by the job runner. One line, no traceback, exit code 2: the remedy is a smaller model, a
    smaller batch or another device, not a bug report.
    """
class PrivacyFinding(Exception):
    """The privacy audit found what must not leave a client (a raw row or column, a value fewer
    than k rows hold) in a message the client was about to send. The message is not sent; the
    job ends with one line and exit code 3, and writes no model (``--audit-findings record``
    lets it go on, and says so in the model)."""

    exit_code = 3
    brief = True
