"""The one exception type for bad user input: the CLI prints its message on one line and exits with code 2."""
from pathlib import Path


class TinynnError(Exception):
    """Bad input from the user (a config key, a file, a prompt); the message names the offender."""


class TinynnNotice(UserWarning):
    """Something the user should know that does not stop the run (a stale lock taken over, a save retried).

    Issued with `warnings.warn`; the CLI prints it as one line, `tinynn: notice: ...`, with no file path."""


def not_found(what: str, path, folder: str = "a folder, not a file") -> TinynnError:
    """The error for a file that is not there; a folder in its place is said to be one (`folder`: what it then
    is), where "not found" would send the user looking for a path that exists."""
    if Path(path).is_dir():
        return TinynnError(f"{what} {path} is {folder}")
    return TinynnError(f"{what} not found: {path}")
