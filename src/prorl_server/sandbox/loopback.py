"""LoopbackAllocator: unique 127.x.y.z addresses for sandboxes that share the host network.

An address is an addressing convention, not isolation: a sandbox on the host network can still bind or
reach any other address. Services inside bind to their own address (exported as PRORL_SANDBOX_ADDRESS) so
that many sandboxes can run the same port side by side.
"""

from __future__ import annotations

import ipaddress
import threading

from prorl_server.sandbox.errors import SandboxError

ENV_ADDRESS = "PRORL_SANDBOX_ADDRESS"
_LOCALHOST = int(ipaddress.IPv4Address("127.0.0.1"))


class LoopbackExhausted(SandboxError):
    """Every address of the allocator's network is in use."""


class LoopbackAllocator:
    """Thread-safe allocator of unique loopback addresses, recycled on release.

    Addresses are handed out round-robin from `network` (default 127.64.0.0/10, about four million
    addresses), skipping 127.0.0.1, addresses ending in .0 or .255, and those in use. Round-robin rather
    than lowest-first, so a just-released address (whose sockets may linger in TIME_WAIT) is reused last.
    Two servers on one node should be given disjoint networks.
    """

    def __init__(self, network: str = "127.64.0.0/10") -> None:
        net = ipaddress.IPv4Network(network)
        if not net.subnet_of(ipaddress.IPv4Network("127.0.0.0/8")):
            raise ValueError(f"{network} is not inside 127.0.0.0/8; give a loopback network")
        self.network = net
        self._first = int(net.network_address)
        self._size = net.num_addresses
        self._next = 0
        self._in_use: set[int] = set()
        self._lock = threading.Lock()

    def _usable(self, value: int) -> bool:
        return value & 0xFF not in (0, 255) and value != _LOCALHOST

    def allocate(self) -> str:
        """A fresh address; raises LoopbackExhausted when none is free."""
        with self._lock:
            for _ in range(self._size):
                value = self._first + self._next
                self._next = (self._next + 1) % self._size
                if value not in self._in_use and self._usable(value):
                    self._in_use.add(value)
                    return str(ipaddress.IPv4Address(value))
        raise LoopbackExhausted(f"all addresses of {self.network} are in use; close sandboxes or widen the network")

    def release(self, address: str) -> None:
        """Give an address back (releasing one not in use is a no-op)."""
        with self._lock:
            self._in_use.discard(int(ipaddress.IPv4Address(address)))

    @property
    def in_use(self) -> int:
        """How many addresses are allocated."""
        with self._lock:
            return len(self._in_use)
