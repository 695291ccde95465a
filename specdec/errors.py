"""Errors a caller can act on. Each maps to one gRPC status and to exit code 2 in the CLI."""


class SpecdecError(Exception):
    """Base class: the message is one line meant for the user."""


class InvalidArgument(SpecdecError, ValueError):
    """A malformed prompt, sampling parameter, draft tree or option (gRPC INVALID_ARGUMENT)."""


class ModelNotFound(SpecdecError, FileNotFoundError):
    """A model path that does not exist or holds no loadable checkpoint (gRPC NOT_FOUND)."""

    def __str__(self) -> str:  # FileNotFoundError would print "[Errno ...]" otherwise
        return str(self.args[0]) if self.args else "model not found"
