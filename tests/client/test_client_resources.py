"""prorl_server.client's layout: calls grouped by resource, the sync client generated from the async one, and
the flat names of before kept as deprecated aliases."""

from __future__ import annotations

import inspect
import warnings
from collections.abc import AsyncIterator

import pytest

import prorl_server.client
from prorl_server.auth_key import API_KEY_FILE_ENV
from prorl_server.client import (
    APIResource,
    Backends,
    DapoCollector,
    Groups,
    Jobs,
    RetryPolicy,
    RolloutClient,
    SyncDapoCollector,
    SyncResultStream,
    SyncRolloutClient,
    Weights,
)
from prorl_server.client.deprecated import MOVED, RENAMED
from prorl_server.client.sync import SyncJobs, SyncResource, sync_resource_class
from prorl_server.protocol import JobResult, JobStatus, LLMServerList, StatusResponse, WeightsStatus
from prorl_server.protocol.server import API_KEY_ENV

FAST_RETRY = RetryPolicy(attempts=5, budget_s=10.0, base_delay_s=0.01, max_delay_s=0.05)
NOOP = {"instance": {"data_source": "noop"}}
NOWHERE = "http://127.0.0.1:9"  # no request is sent in the tests that use it


@pytest.fixture(autouse=True)
def no_api_key_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    monkeypatch.setenv(API_KEY_FILE_ENV, str(tmp_path / "no-key-file"))


def public(cls: type) -> set[str]:
    """The public methods and properties of a class, without the deprecated aliases."""
    return {
        name
        for name in dir(cls)
        if not name.startswith("_")
        and (inspect.isfunction(member := inspect.getattr_static(cls, name)) or isinstance(member, property))
        and not hasattr(member, "deprecated_for")
    }


async def test_the_async_client_is_grouped_by_resource():
    assert {"jobs": Jobs, "groups": Groups, "weights": Weights, "backends": Backends} == RolloutClient.RESOURCES
    assert public(Jobs) == {
        "submit",
        "submit_many",
        "process",
        "get",
        "wait",
        "cancel",
        "server_of",
        "stream",
        "as_completed",
        "collect",
        "ack",
    }
    assert public(Groups) == {"submit", "get", "wait", "cancel", "server_of"}
    assert public(Weights) == {"status", "pause", "update", "resume", "swap", "update_all"}
    assert public(Backends) == {"add", "remove", "list", "clear", "register"}
    assert public(RolloutClient) == {
        "servers",
        "aclose",
        "status",
        "health",
        "handlers",
        "server_states",
        "recoveries",
        "add_server",
        "replace_server",
    }  # + from_endpoints
    async with RolloutClient(NOWHERE, api_key="") as client:
        for name, resource in RolloutClient.RESOURCES.items():
            assert type(getattr(client, name)) is resource and getattr(client, name)._client is client


def test_every_async_method_has_a_sync_twin_with_its_signature():
    pairs = [(RolloutClient, SyncRolloutClient)]
    pairs += [(resource, sync_resource_class(resource)) for resource in RolloutClient.RESOURCES.values()]
    pairs.append((DapoCollector, SyncDapoCollector))
    for async_class, sync_class in pairs:
        assert issubclass(sync_class, SyncResource) and sync_class.__name__ == f"Sync{async_class.__name__}"
        expected = public(async_class) - {"aclose"}  # the sync client has close() instead
        assert public(sync_class) - {"close"} == expected, sync_class
        for name in expected:
            async_member, sync_member = getattr(async_class, name), getattr(sync_class, name)
            assert sync_member.__doc__ == async_member.__doc__, name
            if isinstance(async_member, property):
                continue
            async_params = inspect.signature(async_member).parameters
            assert inspect.signature(sync_member).parameters == async_params, name
            assert not inspect.iscoroutinefunction(sync_member) and not inspect.isasyncgenfunction(sync_member)
    assert inspect.signature(SyncJobs.as_completed).return_annotation == "Iterator[JobResult]"
    assert inspect.signature(SyncJobs.stream).return_annotation == "SyncResultStream"
    assert inspect.signature(SyncJobs.wait).return_annotation == "JobResult"


class Echo(APIResource):
    """A resource the client does not have: added to RolloutClient.RESOURCES, it appears on the sync client."""

    async def status_of_first(self) -> StatusResponse:
        return await self._client.status(server=self._client.servers[0])

    async def countdown(self, n: int) -> AsyncIterator[int]:
        for i in range(n, 0, -1):
            yield i

    def first_server(self) -> str:
        return self._client.servers[0]


def test_a_resource_or_method_added_to_the_async_client_appears_on_the_sync_client(server, monkeypatch):
    monkeypatch.setitem(RolloutClient.RESOURCES, "echo", Echo)
    with SyncRolloutClient(server.url, retry=FAST_RETRY) as client:
        assert type(client.echo).__name__ == "SyncEcho" and isinstance(client.echo, SyncResource)
        assert isinstance(client.echo.status_of_first(), StatusResponse)
        assert list(client.echo.countdown(3)) == [3, 2, 1]
        assert client.echo.first_server() == server.url


def test_a_sync_call_of_each_resource_works_against_a_server(server, backend):
    with SyncRolloutClient(server.url, retry=FAST_RETRY) as client:
        assert client.servers == [server.url] and client.health().running
        assert isinstance(client.status(), StatusResponse) and client.handlers()
        assert isinstance(client.backends.list(), LLMServerList)
        assert client.backends.list().servers[0].address == backend.address
        assert isinstance(client.weights.status()[server.url], WeightsStatus)
        result = client.jobs.process({**NOOP, "job_id": "sync-1"})
        assert isinstance(result, JobResult) and result.status is JobStatus.COMPLETED
        assert client.jobs.server_of("sync-1") == server.url
        gid = client.groups.submit({"instance": {"data_source": "noop"}, "n": 2})
        assert client.groups.wait(gid, timeout=10).status.value == "completed"
        with client.jobs.stream(wait=0.5, timeout=3) as stream:
            assert isinstance(stream, SyncResultStream) and next(stream).job_id == "sync-1"
        job_id = client.jobs.submit(NOOP)
        assert [r.job_id for r in client.jobs.as_completed([job_id], ack=True, timeout=10)] == [job_id]


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
async def test_each_old_async_name_warns_and_calls_its_resource_method(old, new):
    resource, method = new.split(".")
    async with RolloutClient(NOWHERE, api_key="") as client:
        calls = []
        setattr(getattr(client, resource), method, lambda *args, **kwargs: calls.append((args, kwargs)) or "answer")
        message = rf"RolloutClient\.{old}\(\) is deprecated; use RolloutClient\.{resource}\.{method}\(\)"
        with pytest.warns(DeprecationWarning, match=message) as caught:
            assert getattr(client, old)("x", server="s") == "answer"
        assert calls == [(("x",), {"server": "s"})]
        assert caught[0].filename == __file__  # the warning names the caller's line


@pytest.mark.parametrize(("old", "new"), sorted(RENAMED.items()))
def test_each_old_sync_name_warns_and_calls_its_resource_method(old, new):
    resource, method = new.split(".")
    with SyncRolloutClient(NOWHERE, api_key="") as client:
        calls = []
        setattr(getattr(client, resource), method, lambda *args, **kwargs: calls.append((args, kwargs)) or "answer")
        message = rf"SyncRolloutClient\.{old}\(\) is deprecated; use SyncRolloutClient\.{resource}\.{method}\(\)"
        with pytest.warns(DeprecationWarning, match=message) as caught:
            assert getattr(client, old)("x", server="s") == "answer"
        assert calls == [(("x",), {"server": "s"})]
        assert caught[0].filename == __file__


async def test_old_names_still_work_against_a_server(server):
    with pytest.warns(DeprecationWarning) as caught:
        async with RolloutClient(server.url, retry=FAST_RETRY) as client:
            job_id = await client.submit(NOOP)
            assert (await client.wait(job_id, timeout=10)).status is JobStatus.COMPLETED
            assert client.server_of(job_id) == server.url
            assert [r.job_id async for r in client.as_completed([job_id], timeout=10)] == [job_id]
            assert set(await client.weights()) == {server.url}
            assert (await client.llm_servers()).servers
    assert [str(w.message).split("()")[0] for w in caught] == [
        "RolloutClient.submit",
        "RolloutClient.wait",
        "RolloutClient.server_of",
        "RolloutClient.as_completed",
        "RolloutClient.weights",
        "RolloutClient.llm_servers",
    ]

    with pytest.warns(DeprecationWarning) as caught, SyncRolloutClient(server.url, retry=FAST_RETRY) as sync:
        assert sync.process({**NOOP, "job_id": "old"}).status is JobStatus.COMPLETED
        with sync.stream_results(wait=0.5, timeout=3) as stream:
            assert {r.job_id for r in stream} >= {job_id, "old"}
        assert sync.collect(sync.submit_many([NOOP]), ack=True, timeout=10)[0].reward == 1.0
        assert set(sync.weights()) == {server.url}
    assert len(caught) == 5


def test_the_new_names_warn_nothing(server):
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with SyncRolloutClient(server.url, retry=FAST_RETRY) as client:
            client.jobs.collect(client.jobs.submit_many([NOOP]), ack=True, timeout=10)
            client.weights.status()
            client.backends.list()


# --- names that moved out of prorl_server.client ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MOVED))
def test_each_moved_name_still_imports_from_the_client_warns_and_is_the_same_object(name):
    import prorl_server.launch

    message = rf"prorl_server\.client\.{name} is deprecated: import it from prorl_server\.launch"
    with pytest.warns(DeprecationWarning, match=message) as caught:
        exec(f"from prorl_server.client import {name} as alias", namespace := {})
    assert namespace["alias"] is getattr(prorl_server.launch, name)
    with pytest.warns(DeprecationWarning, match=message) as caught:
        alias = getattr(prorl_server.client, name)
    assert alias is getattr(prorl_server.launch, name)
    assert caught[0].filename == __file__  # the warning names the caller's line
    module = rf"prorl_server\.client\.local_stack\.{name} is deprecated: import it from prorl_server\.launch"
    with pytest.warns(DeprecationWarning, match=module):
        from prorl_server.client import local_stack  # the module of before the move

        assert getattr(local_stack, name) is getattr(prorl_server.launch, name)


def test_the_moved_names_stay_out_of_the_clients_public_names_and_others_are_still_missing():
    assert not set(MOVED) & set(prorl_server.client.__all__)  # `import *` warns nothing
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchName'"):
        prorl_server.client.NoSuchName  # noqa: B018
