"""Typed errors. They cross the control plane (raised in an actor, re-raised at the caller), so
each says what to do."""

from __future__ import annotations


class ScopecastError(Exception):
    """Base class of every scopecast error."""


def typed_cause(exc: BaseException) -> ScopecastError | None:
    """The typed error a Ray call failed with (Ray wraps it in a RayTaskError), if it was ours."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, ScopecastError) else None


def actor_fault(exc: BaseException) -> str:
    """One line saying why a call to an actor failed: the exception its method or creation task
    raised (the last line of the traceback Ray carries), not only that the actor died."""
    text = str(getattr(exc, "error_msg", "") or exc).strip()
    last = text.splitlines()[-1].strip() if text else ""
    return last if ":" in last else f"{type(exc).__name__}: {last or text}"


class NotConnected(ScopecastError):
    """No scopecast cluster to talk to."""


class TopicNotFound(ScopecastError, KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(f"topic {name!r} does not exist; create it with "
                         f"cluster.create_topic({name!r}) or `scopecast topic create {name}`")
        self.name = name

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]

    def __reduce__(self):  # rebuilt from its name across Ray, not from its message
        return type(self), (self.name,)


class TopicExists(ScopecastError):
    """A topic of that name exists with other settings."""


class MemberExpired(ScopecastError):
    """The scope no longer knows this member (it missed its heartbeats, or was removed); the
    member's controlled element registers again by itself."""


class ScopeRetired(ScopecastError):
    """The scope retired (it had no members for `empty_scope_timeout`) as this call reached it;
    the member's controlled element has the scope made again and joins it by itself."""


class PluginRejected(ScopecastError):
    """A plug-in failed validation or trust checks."""


class PermissionDenied(ScopecastError, PermissionError):
    """The member's credential does not let it publish or subscribe to that topic, or the
    credential itself is not one of this cluster's."""


class FlushTimeout(ScopecastError, TimeoutError):
    """Messages were not yet stable (unreliable topics: not yet sent) when the timeout expired."""


class ControlTimeout(ScopecastError, TimeoutError):
    """A scope manager did not answer a control call in time: it is busy (laying out thousands
    of topics at once) or restarting. The call may still take effect; retrying is safe."""


class WindowFull(ScopecastError):
    """publish() on a non-blocking member whose window of unstable messages is full."""


class PublisherClosed(ScopecastError):
    """publish() or flush() on a closed publisher."""


class InvalidConfig(ScopecastError, ValueError):
    """A configuration value out of range."""


class MessageTooLarge(ScopecastError, ValueError):
    """A message above the configured maximum message size."""


class SparkUnavailable(ScopecastError):
    """Spark cannot start on this Ray cluster (no Java 17+, not enough free CPUs for the executors,
    or already running); the message says what to change."""


class MissingExtra(ScopecastError, ImportError):
    """A call needs an optional part of scopecast that is not installed; `extra` names it (`pip
    install 'scopecast[extra]'`)."""

    def __init__(self, message: str, extra: str = "") -> None:
        super().__init__(message)
        self.extra = extra

    def __reduce__(self):
        return type(self), (str(self), self.extra)


class IncompatibleVersion(ScopecastError):
    """Two parts of scopecast that cannot understand each other: `what` (the datagram wire
    format, the state database), the version found there and the one this side reads."""

    def __init__(self, message: str, what: str = "", found: int | None = None,
                 supported: int | None = None) -> None:
        super().__init__(message)
        self.what, self.found, self.supported = what, found, supported

    @classmethod
    def of(cls, what: str, found: int | None, supported: int, fix: str) -> IncompatibleVersion:
        return cls(f"{what} version {found} where this scopecast reads version {supported}: "
                   f"{fix}", what, found, supported)

    def __reduce__(self):
        return type(self), (str(self), self.what, self.found, self.supported)


class DataFrameRejected(ScopecastError, ValueError):
    """A DataFrame that cannot be published to topics (a map column, nesting too deep, a row over the
    maximum message size, too many `topic_column` values, ...); the message names the column."""


class CollectIncomplete(ScopecastError):
    """A collector got a publisher's end message but not every message before it (possible only
    on a topic without recovery, or after a member failure)."""


class PipelineError(ScopecastError):
    """A pipeline could not be submitted or managed (the message says why)."""


class PipelineNotFound(PipelineError, LookupError):
    """No job with that id on the cluster."""
