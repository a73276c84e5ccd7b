"""The root of casmoe's user-facing errors: the CLI prints these as one line, no traceback."""


class CasmoeError(Exception):
    """Bad input or configuration that the user can fix; the message says how."""
