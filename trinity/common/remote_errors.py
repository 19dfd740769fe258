"""What a remote call really raised.

Ray re-raises an actor's exception as a class deriving from both `RayTaskError` and the
original type, so `except BufferClosed` still catches it, but its `str()` is the whole remote
traceback. `cause_of` gives back the original exception, for messages a user reads and for
type checks on errors that Ray did not re-type."""

from __future__ import annotations


def cause_of(error: BaseException) -> BaseException:
    """The exception an actor raised, if `error` carries one from Ray; else `error` itself."""
    import ray.exceptions

    if isinstance(error, ray.exceptions.RayTaskError) and error.cause is not None:
        return error.cause
    return error
