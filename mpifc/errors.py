"""Errors that the CLI reports as one clear line with exit code 2."""


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
