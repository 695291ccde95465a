"""Errors a caller can act on. Each maps to one gRPC status and to exit code 2 in the CLI."""


class SpecdecError(Exception):
    """Base class: the message is one line meant for the user."""


class InvalidArgument(SpecdecError, ValueError):
    """A malformed prompt, sampling parameter, draft tree or option (gRPC INVALID_ARGUMENT)."""


class ModelNotFound(SpecdecError, FileNotFoundError):
    """A model path that does not exist or holds no loadable checkpoint (gRPC NOT_FOUND)."""

    def __str__(self) -> str:  # FileNotFoundError would print "[Errno ...]" otherwise
        return str(self.args[0]) if self.args else "model not found"


class Unauthenticated(SpecdecError):
    """The server needs an API key and the call had none or a wrong one (gRPC UNAUTHENTICATED)."""


class PermissionDenied(SpecdecError):
    """The caller is known but may not do this: release a sequence it does not own, for example
    (gRPC PERMISSION_DENIED)."""


class ResourceExhausted(SpecdecError):
    """The server's queue is full (gRPC RESOURCE_EXHAUSTED): retry later."""


class Unavailable(SpecdecError):
    """No healthy worker, or the server is draining (gRPC UNAVAILABLE)."""


class DeadlineExceeded(SpecdecError, TimeoutError):
    """The caller's deadline passed before the generation finished (gRPC DEADLINE_EXCEEDED)."""


class Cancelled(SpecdecError):
    """The call was cancelled (gRPC CANCELLED)."""


class Internal(SpecdecError):
    """A step of this generation failed on the server; other generations go on (gRPC INTERNAL)."""


class ServerError(SpecdecError):
    """Any other failure reported by a server (gRPC INTERNAL, UNKNOWN, ...)."""
