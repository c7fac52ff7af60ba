"""The loopback allocator hands out unique 127.x.y.z addresses from many threads and recycles them."""

from __future__ import annotations

import ipaddress
import threading

import pytest

from prorl_server.sandbox import LoopbackAllocator, LoopbackExhausted


def test_addresses_are_unique_across_threads_and_inside_the_network():
    allocator = LoopbackAllocator("127.64.0.0/16")
    got: list[str] = []
    lock = threading.Lock()

    def take() -> None:
        mine = [allocator.allocate() for _ in range(500)]
        with lock:
            got.extend(mine)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == len(set(got)) == 4000 == allocator.in_use
    for address in got:
        ip = ipaddress.IPv4Address(address)
        assert ip in allocator.network and ip.is_loopback
        assert address != "127.0.0.1" and address.split(".")[-1] not in ("0", "255")


def test_released_addresses_are_reused_last_then_recycled():
    allocator = LoopbackAllocator("127.9.9.0/29")  # .1 to .7 usable
    first = [allocator.allocate() for _ in range(7)]
    assert first == [f"127.9.9.{i}" for i in range(1, 8)]
    with pytest.raises(LoopbackExhausted, match="in use"):
        allocator.allocate()
    allocator.release("127.9.9.3")
    assert allocator.allocate() == "127.9.9.3"
    allocator.release("127.9.9.5")
    allocator.release("127.9.9.2")
    assert {allocator.allocate(), allocator.allocate()} == {"127.9.9.2", "127.9.9.5"}
    allocator.release("127.9.9.200")  # never handed out: no-op
    assert allocator.in_use == 7


def test_round_robin_does_not_hand_back_a_just_released_address_while_others_are_free():
    allocator = LoopbackAllocator("127.10.0.0/24")
    a = allocator.allocate()
    allocator.release(a)
    assert allocator.allocate() != a


def test_network_must_be_loopback():
    with pytest.raises(ValueError, match="loopback"):
        LoopbackAllocator("10.0.0.0/8")
