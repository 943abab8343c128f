"""The one exception type for bad user input: the CLI prints its message on one line and exits with code 2."""


class TinynnError(Exception):
    """Bad input from the user (a config key, a file, a prompt); the message names the offender."""


class TinynnNotice(UserWarning):
    """Something the user should know that does not stop the run (a stale lock taken over, a save retried).

    Issued with `warnings.warn`; the CLI prints it as one line, `tinynn: notice: ...`, with no file path."""
