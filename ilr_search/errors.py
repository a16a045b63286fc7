"""The one error type the CLI turns into `error: ...` and exit code 2: bad input, with how to fix it."""


class UserInputError(ValueError):
    """Input that cannot be used (a malformed value, a missing file, an unknown study...)."""


class StorageFullError(UserInputError):
    """The disk holding the storage (or a checkpoint) is full; finished trials are kept."""


class DataError(UserInputError):
    """A corpus or tokenizer that cannot be used."""


class CheckpointError(UserInputError):
    """A checkpoint that cannot be read, or a model that cannot be written as one."""
