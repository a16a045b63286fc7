"""The one error type the CLI turns into `error: ...` and exit code 2: bad input, with how to fix it."""


class UserInputError(ValueError):
    """Input that cannot be used (a malformed value, a missing file, an unknown study...)."""


class StorageFullError(UserInputError):
    """The disk holding the storage (or a checkpoint) is full; finished trials are kept."""


class DataError(UserInputError):
    """A corpus or tokenizer that cannot be used."""


class CheckpointError(UserInputError):
    """A checkpoint that cannot be read, or a model that cannot be written as one."""


def first_line(e: BaseException, most: int = 200) -> str:
    """What an error line shows of an exception from a library: its message's first line (at most `most`
    characters), or its type's name where it has no message."""
    text = str(e).strip()
    return text.splitlines()[0][:most] if text else type(e).__name__
