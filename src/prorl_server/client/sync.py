"""`SyncRolloutClient`: the async RolloutClient for code without an event loop, run on a thread of its own.

Nothing here is written twice: the blocking classes are generated from the async ones. `SyncResource`
subclasses name the async class they mirror (`class SyncJobs(SyncResource, twin_of=Jobs)`), and every public
method of it gets a blocking twin at class creation: a coroutine method runs on the client's loop thread, an
async generator method becomes an iterator, a plain method whose answer is an async iterator (a
ResultStream) hands back a SyncResultStream, and a property reads through. A method added to an async
resource (or a resource added to `RolloutClient.RESOURCES`) thus appears on the sync client by itself.
SyncDapoCollector is DapoCollector's twin made the same way.

Typing: the generated methods are real functions, with the async methods' signatures, docstrings and
answers (`inspect.signature`, `help()`); for static checkers, a SyncResource answers any attribute as `Any`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from prorl_server.client.collector import DapoCollector, RequestSource, StepReport
from prorl_server.client.deprecated import add_deprecated_aliases
from prorl_server.client.resources import APIResource, Backends, Groups, Jobs, Weights
from prorl_server.client.rollout_client import RolloutClient
from prorl_server.client.stream import Cursor
from prorl_server.protocol import JobResult, read_endpoints
from prorl_server.threadsafe import call_in_loop, run_in_loop

T = TypeVar("T")


class SyncResource:
    """Blocking twin of an async resource (`twin_of=`): its public methods, generated (see the module).
    Each instance wraps one async object (`_target`) and runs its calls on `_owner`'s loop thread."""

    _twin_of: ClassVar[type]
    """The async class this one mirrors."""
    _twins: ClassVar[dict[type, type[SyncResource]]] = {}
    """Async class -> its blocking twin, for every SyncResource subclass."""

    def __init__(self, owner: SyncRolloutClient, target: Any) -> None:
        self._owner = owner
        self._target = target

    def __init_subclass__(cls, twin_of: type | None = None, skip: frozenset[str] = frozenset(), **options: Any) -> None:
        super().__init_subclass__(**options)
        if twin_of is None:
            return
        cls._twin_of = twin_of
        SyncResource._twins[twin_of] = cls
        for name in dir(twin_of):
            if name.startswith("_") or name in skip or name in cls.__dict__:
                continue
            member = inspect.getattr_static(twin_of, name)
            if hasattr(member, "deprecated_for"):
                continue  # an old name: the sync class gets its own alias, to its own resource method
            if isinstance(member, property):
                setattr(cls, name, _read_through(name, member))
            elif inspect.isfunction(member):
                setattr(cls, name, _blocking(cls, name, member))

    if TYPE_CHECKING:

        def __getattr__(self, name: str) -> Any: ...


class SyncResultStream:
    """Blocking view of a ResultStream (or any async iterator): `for result in stream`, `stream.cursor`,
    `stream.close()`."""

    def __init__(self, owner: SyncRolloutClient, stream: AsyncIterator[JobResult]) -> None:
        self._stream = stream
        self._results = owner._iterate(stream)

    @property
    def cursor(self) -> Cursor:
        """Per server, where the stream is; pass it as `after=` to resume."""
        return self._stream.cursor  # type: ignore[attr-defined]

    def __iter__(self) -> Iterator[JobResult]:
        return self._results

    def __next__(self) -> JobResult:
        return next(self._results)

    def close(self) -> None:
        """Stop the stream (its long polls are cancelled)."""
        self._results.close()

    def __enter__(self) -> SyncResultStream:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def _blocking(owner_class: type, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """The blocking twin of the async class's method `name` (`function`)."""
    if inspect.iscoroutinefunction(function):

        def method(self: SyncResource, *args: Any, **kwargs: Any) -> Any:
            return self._owner._run(getattr(self._target, name)(*args, **kwargs))

        answer = inspect.signature(function).return_annotation
    elif inspect.isasyncgenfunction(function):

        def method(self: SyncResource, *args: Any, **kwargs: Any) -> Any:
            return self._owner._iterate(getattr(self._target, name)(*args, **kwargs))

        answer = str(inspect.signature(function).return_annotation).replace("AsyncIterator", "Iterator")
    else:

        def method(self: SyncResource, *args: Any, **kwargs: Any) -> Any:
            result = getattr(self._target, name)(*args, **kwargs)
            return SyncResultStream(self._owner, result) if hasattr(result, "__anext__") else result

        answer = str(inspect.signature(function).return_annotation).replace("ResultStream", "SyncResultStream")
    functools.update_wrapper(method, function)
    del method.__wrapped__  # type: ignore[attr-defined]  # its own signature, below, not the async one
    method.__module__, method.__qualname__ = owner_class.__module__, f"{owner_class.__name__}.{name}"
    method.__signature__ = inspect.signature(function).replace(return_annotation=answer)  # type: ignore[attr-defined]
    return method


def _read_through(name: str, member: property) -> property:
    return property(lambda self: getattr(self._target, name), doc=member.__doc__)


class SyncJobs(SyncResource, twin_of=Jobs):
    """Blocking `client.jobs` (see Jobs)."""


class SyncGroups(SyncResource, twin_of=Groups):
    """Blocking `client.groups` (see Groups)."""


class SyncWeights(SyncResource, twin_of=Weights):
    """Blocking `client.weights` (see Weights)."""


class SyncBackends(SyncResource, twin_of=Backends):
    """Blocking `client.backends` (see Backends)."""


def sync_resource_class(resource: type[APIResource]) -> type[SyncResource]:
    """The blocking twin of an async resource class (made now for one not declared above)."""
    twin = SyncResource._twins.get(resource)
    if twin is None:
        twin = type(f"Sync{resource.__name__}", (SyncResource,), {"__doc__": resource.__doc__}, twin_of=resource)
    return twin


class SyncRolloutClient(SyncResource, twin_of=RolloutClient, skip=frozenset({"aclose"})):
    """Blocking twin of RolloutClient (same arguments, same resources and methods, same errors): each call
    runs the async client on an event loop thread this object owns (`prorl-client-loop`). `close()` (or
    `with`) stops it.

        with SyncRolloutClient("http://127.0.0.1:8000") as client:
            job_ids = client.jobs.submit_many(requests)
            for result in client.jobs.as_completed(job_ids, progress=True, ack=True):
                ...
    """

    jobs: SyncJobs
    groups: SyncGroups
    weights: SyncWeights
    backends: SyncBackends

    def __init__(self, servers: str | Sequence[str], **options: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="prorl-client-loop", daemon=True)
        self._thread.start()
        self._closed = False
        try:
            self.client: RolloutClient = self._run(_build(servers, options))
        except BaseException:
            self._stop_loop()
            raise
        super().__init__(self, self.client)
        for name in RolloutClient.RESOURCES:
            resource = getattr(self.client, name)
            setattr(self, name, sync_resource_class(type(resource))(self, resource))

    @classmethod
    def from_endpoints(cls, path: str | Path, **options: Any) -> SyncRolloutClient:
        """A client of the servers listed in an endpoints file (written by deploy/slurm/)."""
        return cls(read_endpoints(path).servers, **options)

    def close(self) -> None:
        """Close the connections and stop the loop thread (idempotent)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self.client.aclose())
        finally:
            self._stop_loop()

    def __enter__(self) -> SyncRolloutClient:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _run(self, call: Coroutine[Any, Any, T]) -> T:
        """Run a coroutine on the loop thread and wait for it; an interrupt (Ctrl-C) cancels it."""
        if not self._thread.is_alive():
            call.close()
            raise RuntimeError("this SyncRolloutClient is closed")
        future = run_in_loop(self._loop, call)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _iterate(self, results: AsyncIterator[T]) -> Iterator[T]:
        try:
            while True:
                try:
                    yield self._run(_next(results))
                except StopAsyncIteration:
                    return
        finally:
            close = getattr(results, "aclose", None)
            if close is not None and self._thread.is_alive():
                self._run(close())

    def _stop_loop(self) -> None:
        call_in_loop(self._loop, self._loop.stop)
        self._thread.join()
        self._loop.close()


add_deprecated_aliases(
    SyncRolloutClient, {name: SyncResource._twins[cls] for name, cls in RolloutClient.RESOURCES.items()}
)


class SyncDapoCollector(SyncResource, twin_of=DapoCollector, skip=frozenset({"aclose"})):
    """Blocking twin of DapoCollector on a SyncRolloutClient's loop thread (same arguments after the client),
    generated as the client is.

    with SyncRolloutClient(url) as client, SyncDapoCollector(client, prompts, target_groups=32,
                                                              max_groups_in_flight=48) as collector:
        report = collector.collect_step()
    """

    def __init__(self, client: SyncRolloutClient, requests: RequestSource, **options: Any) -> None:
        self.collector = DapoCollector(client.client, requests, **options)
        super().__init__(client, self.collector)

    def close(self) -> StepReport:
        """See DapoCollector.aclose."""
        return self._owner._run(self.collector.aclose())

    def __enter__(self) -> SyncDapoCollector:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


async def _build(servers: str | Sequence[str], options: dict[str, Any]) -> RolloutClient:
    return RolloutClient(servers, **options)


async def _next(results: AsyncIterator[T]) -> T:
    return await anext(results)
