"""The one exception type for bad user input: the CLI prints its message on one line and exits with code 2."""


class TinynnError(Exception):
    """Bad input from the user (a config key, a file, a prompt); the message names the offender."""
