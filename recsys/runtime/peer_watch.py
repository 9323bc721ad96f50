"""The peer watch: every rank of a multi-process run watches every other rank and ends the job
with one line naming the rank and host it lost, instead of hanging in a collective.

A killed process closes its sockets, but a cut network link sends nothing: TCP stalls, and Gloo,
MPI and Horovod wait for many minutes. So each rank (started by the run shell when the world size
is above 1) opens its own small TCP listener, the ranks exchange where theirs are
(`allgather_object`), and every rank connects to every other one. A daemon thread sends a heartbeat
line over each outgoing connection every few seconds and reads the incoming ones: a peer whose
connection closes without its "done" (its process ended) is lost at once, and one that has sent
nothing for `timeout_s` (a cut link; a frozen process, whose kernel would still accept a
connection but whose thread answers nothing) is lost then. The rank prints

    error: lost rank 2 on host node3 (no answer from 10.1.0.3:41234 for 25 s); stopping

(grouped per host: once one peer is lost, every peer silent for half the timeout is named with it,
so the rank on a cut-off host names all the ranks behind the cut, whose last beats came up to an
interval apart),
tells its peers what it lost ("gone ...": they end at once with that line, ending with `, as rank R
on host H found`, instead of reporting its exit as a loss of their own), flushes the logs and ends
with exit code 1 (cli.FAILURE) through `safe_io.exit_now`, which never ends the process between a
staged output's renames: checkpoints on disk stay whole. A rank whose job ends says "done" before
closing its connections, so a clean finish is never taken for a loss, whatever order the ranks
leave in. A watch thread that itself stood still for half the timeout (its process stopped or
starved) gives every peer a new full timeout instead of blaming them.

Addresses: the listener binds every interface; a peer is reached over the loopback when it runs in
the same network namespace of the same boot (a one-host run), otherwise over the first address it
announced that connects: Horovod's Gloo interface (HOROVOD_GLOO_IFACE, the one the launcher found
every host shares), the address of its host name, then its other interface addresses (an address
that ranks of several hosts announce, a container bridge's, is never tried).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from recsys.runtime import safe_io
from recsys.runtime.cli import FAILURE, stderr_line

TIMEOUT_VARIABLE = "DLRM_PEER_TIMEOUT"
DEFAULT_TIMEOUT_S = 25.0
CONNECT_TIMEOUT_S = 5.0
LOG_FLUSH_LIMIT_S = 5.0
_SIOCGIFADDR = 0x8915  # Linux ioctl: an interface's IPv4 address


class PeerWatchError(RuntimeError):
    """The watch cannot start (a peer unreachable at every address it announced); the same on every rank."""


def timeout_from_environment(environ: Mapping[str, str] = os.environ) -> float:
    """Seconds a peer may stay silent before it counts as lost: DLRM_PEER_TIMEOUT, default 25 (which
    keeps detection, exit and the launcher's teardown well within a minute); 0 turns the watch off.
    Raises ValueError naming the variable for anything else than a number >= 0."""
    text = environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{TIMEOUT_VARIABLE}={text!r}: expected the seconds a silent peer is waited for "
                         f"(a number >= 0; 0 turns the peer watch off)")
    return value


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """Where one rank's listener is, as every rank learns it."""
    rank: int
    host: str                   # the name the launcher knows the host by, for messages
    addresses: Tuple[str, ...]  # IPv4 addresses to try, best first
    port: int
    place: str                  # boot id and network namespace: equal means the loopback reaches it


def host_name(environ: Mapping[str, str] = os.environ) -> str:
    """This host as the launcher names it (horovodrun's -H names, Slurm's node names), else its hostname."""
    return environ.get("HOROVOD_HOSTNAME") or environ.get("SLURMD_NODENAME") or socket.gethostname()


def _interface_address(interface: str) -> Optional[str]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            packed = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, struct.pack("256s", interface.encode()[:15]))
        except OSError:
            return None
    return socket.inet_ntoa(packed[20:24])


def candidate_addresses(environ: Mapping[str, str] = os.environ) -> Tuple[str, ...]:
    """This host's non-loopback IPv4 addresses, the one peers most likely reach first."""
    found: List[Optional[str]] = []
    if environ.get("HOROVOD_GLOO_IFACE"):
        found.append(_interface_address(environ["HOROVOD_GLOO_IFACE"]))
    try:
        found.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    found += [_interface_address(name) for _, name in socket.if_nameindex()]
    return tuple(dict.fromkeys(a for a in found if a and not a.startswith("127.")))


def _place() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/net').st_ino}"
    except OSError:
        return f"unknown/{secrets.token_hex(8)}"  # equal to no other rank's: the loopback is never guessed


def _connect(endpoint: Endpoint, same_place: bool) -> Tuple[socket.socket, str]:
    """A connection to `endpoint`'s listener and the address it went to; OSError if none answers."""
    addresses = ("127.0.0.1",) if same_place else endpoint.addresses
    error: OSError = OSError("it announced no address")
    for address in addresses:
        try:
            return socket.create_connection((address, endpoint.port), timeout=CONNECT_TIMEOUT_S), address
        except OSError as failed:
            error = failed
    raise OSError(f"{', '.join(addresses) or 'no address'} port {endpoint.port}: {error}")


@dataclasses.dataclass
class _Peer:
    endpoint: Endpoint
    address: str                                  # where this rank reached it
    outgoing: socket.socket                       # heartbeats go out here
    last_heard: float                             # monotonic time of its last line
    done: bool = False
    closed: bool = False                          # its incoming connection ended without "done"

    def where(self) -> str:
        return f"{self.address}:{self.endpoint.port}"


class PeerWatch:
    """The running watch of one rank (see the module docstring); `stop` ends it with "done"."""

    def __init__(self, rank: int, timeout_s: float, listener: socket.socket, token: str,
                 peers: Dict[int, _Peer], before_exit: Callable[[], None]) -> None:
        self.rank = rank
        self.timeout_s = timeout_s
        self.interval_s = min(2.0, timeout_s / 5)
        self._listener = listener
        self._token = token
        self._peers = peers
        self._before_exit = before_exit
        self._lock = threading.Lock()      # held to end the process or to stop: one of them, once
        self._stopped = False
        self._lost = threading.Event()
        self._reported: List[str] = []  # losses peers reported as they ended
        now = time.monotonic()
        for peer in peers.values():
            peer.last_heard = now  # silence counts from here: connecting may have taken a while
        threading.Thread(target=self._run, name="peer-watch", daemon=True).start()

    def _beat(self) -> None:
        for peer in self._peers.values():
            if not peer.done:
                try:
                    peer.outgoing.send(b"beat\n", socket.MSG_DONTWAIT)
                except OSError:
                    pass  # a full buffer (a stalled link) or a gone peer: its silence tells

    def _run(self) -> None:
        incoming: Dict[socket.socket, Optional[int]] = {}  # connection -> rank once it said hello
        pending: Dict[socket.socket, bytes] = {}
        ready = selectors.DefaultSelector()  # epoll: no limit on descriptor numbers, unlike select()
        ready.register(self._listener, selectors.EVENT_READ)

        def drop(sock: socket.socket) -> Optional[int]:
            ready.unregister(sock)
            sock.close()
            pending.pop(sock)
            return incoming.pop(sock)

        next_beat = 0.0
        checked = time.monotonic()
        while not self._stopped:
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = now + self.interval_s
            for key, _ in ready.select(max(0.0, next_beat - now)):
                sock = key.fileobj
                if sock is self._listener:
                    with contextlib.suppress(OSError):
                        connection, _ = self._listener.accept()
                        incoming[connection], pending[connection] = None, b""
                        ready.register(connection, selectors.EVENT_READ)
                    continue
                try:
                    data = sock.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    rank = drop(sock)
                    if rank is not None and not self._peers[rank].done:
                        self._peers[rank].closed = True
                    continue
                *lines, pending[sock] = (pending[sock] + data).split(b"\n")
                for line in lines:
                    incoming[sock] = self._heard(incoming[sock], line.decode(errors="replace").strip())
                if incoming[sock] is None and len(pending[sock]) > 200:  # not one of ours
                    drop(sock)
            now = time.monotonic()
            if now - checked > self.timeout_s / 2:
                # this process itself stood still (stopped, starved): the peers' silence meanwhile
                # says nothing about them, so each gets a full timeout from now
                for peer in self._peers.values():
                    peer.last_heard = now
            checked = now
            self._check(now)
        for sock in [self._listener, *incoming]:
            sock.close()
        ready.close()

    def _heard(self, rank: Optional[int], line: str) -> Optional[int]:
        """Apply one line from a connection; returns the connection's rank (None before its hello)."""
        words = line.split()
        if rank is None:
            if len(words) == 3 and words[0] == "hello" and words[1] == self._token and words[2].isdigit() \
                    and int(words[2]) in self._peers:
                rank = int(words[2])
            else:
                return None
        peer = self._peers[rank]
        peer.last_heard = time.monotonic()
        if words == ["done"]:
            peer.done = True
        elif words[:1] == ["gone"]:  # it is ending for a loss of its own: that loss, not its exit, is the news
            peer.done = True
            self._reported.append(f"{line[len('gone '):]}, as rank {rank} on host {peer.endpoint.host} found")
        return rank

    def _check(self, now: float) -> None:
        closed = [peer for peer in self._peers.values() if peer.closed and not peer.done]
        quiet = [peer for peer in self._peers.values() if not peer.done and not peer.closed]
        silent = [peer for peer in quiet if now - peer.last_heard > self.timeout_s]
        if closed or silent:
            # a cut link silences every peer behind it at once, but their last beats came up to an
            # interval apart: once one is lost, each peer silent for half the timeout (a live one
            # beats every interval, at most a fifth of it) is named too, not left for a later line
            silent = [peer for peer in quiet if now - peer.last_heard > self.timeout_s / 2]
            self._end(describe_losses(closed, silent, now), {peer.endpoint.rank for peer in closed + silent})
        elif self._reported:
            self._end(self._reported[0], set())

    def _end(self, losses: str, lost: Set[int]) -> None:
        """Print the one line, tell the peers not `lost` what was lost, flush the logs and end the
        process (unless the watch was stopped)."""
        if not self._lock.acquire(blocking=False):
            return
        if self._stopped:
            self._lock.release()
            return
        self._lost.set()
        stderr_line(f"error: lost {losses}; stopping")
        for rank, peer in self._peers.items():
            if rank not in lost:
                with contextlib.suppress(OSError):
                    peer.outgoing.send(f"gone {losses}\n".encode(), socket.MSG_DONTWAIT)
        flushing = threading.Thread(target=self._flush, daemon=True)
        flushing.start()
        flushing.join(LOG_FLUSH_LIMIT_S)  # a log on the lost network must not keep the process here
        safe_io.exit_now(FAILURE)

    def _flush(self) -> None:
        with contextlib.suppress(OSError):
            self._before_exit()
        with contextlib.suppress(OSError):
            sys.stdout.flush()

    def wait_for_loss(self, seconds: float) -> bool:
        """Whether the watch finds a lost peer within `seconds` (then it is ending the process): the
        shell asks when the job failed, since a peer's death also fails the collective it was in."""
        return self._lost.wait(seconds)

    def stop(self) -> None:
        """End the watch: every peer is told "done" (this rank leaves on purpose) and the outgoing
        connections close; the thread closes the rest as it leaves. Blocks forever if the watch is
        already ending the process."""
        with self._lock:
            self._stopped = True
        for peer in self._peers.values():
            with contextlib.suppress(OSError):
                peer.outgoing.send(b"done\n", socket.MSG_DONTWAIT)
            peer.outgoing.close()


def describe_losses(closed: Sequence[_Peer], silent: Sequence[_Peer], now: float) -> str:
    """The lost peers for the error line, per host: `rank 2 on host node3 (no answer from
    10.1.0.3:41234 for 25 s)` (the group's shortest silence up to `now`, in whole seconds), `ranks 4,
    5 on host node2 (their connections closed: the processes ended)`; the groups joined with `, `."""
    groups: Dict[Tuple[str, bool], List[_Peer]] = {}
    for peer, is_silent in [*((peer, False) for peer in closed), *((peer, True) for peer in silent)]:
        groups.setdefault((peer.endpoint.host, is_silent), []).append(peer)
    parts = []
    for (host, is_silent), peers in groups.items():
        peers = sorted(peers, key=lambda peer: peer.endpoint.rank)
        ranks = [peer.endpoint.rank for peer in peers]
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"
        if is_silent:
            silence_s = int(min(now - peer.last_heard for peer in peers))
            why = f"no answer from {', '.join(peer.where() for peer in peers)} for {silence_s} s"
        else:
            why = "its connection closed: the process ended" if len(peers) == 1 else \
                "their connections closed: the processes ended"
        parts.append(f"{label} on host {host} ({why})")
    return ", ".join(parts)


def start(rank: int, timeout_s: float, allgather_object: Callable[[Any], List[Any]],
          before_exit: Callable[[], None]) -> PeerWatch:
    """Start this rank's watch over every other rank (a collective: every rank calls it at the same
    point). `allgather_object` is the job's object allgather; `before_exit` flushes the logs before a
    loss ends the process. Raises PeerWatchError on every rank when some rank cannot reach a peer."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(128)
    mine = Endpoint(rank, host_name(), candidate_addresses(), listener.getsockname()[1], _place())
    token = secrets.token_hex(8)
    gathered = allgather_object((mine, token))
    endpoints: List[Endpoint] = [endpoint for endpoint, _ in gathered]
    token = gathered[0][1]  # rank 0's: connections of other programs are ignored
    hosts_of: Dict[str, set] = {}
    for endpoint in endpoints:
        for address in endpoint.addresses:
            hosts_of.setdefault(address, set()).add(endpoint.place)
    peers, problems = {}, []
    for endpoint in endpoints:
        if endpoint.rank == rank:
            continue
        # an address that several hosts announce (a container bridge's) would reach the wrong one
        unique = tuple(address for address in endpoint.addresses if len(hosts_of[address]) == 1)
        endpoint = dataclasses.replace(endpoint, addresses=unique)
        try:
            outgoing, address = _connect(endpoint, endpoint.place == mine.place)
            outgoing.sendall(f"hello {token} {rank}\n".encode())
        except OSError as error:
            problems.append(f"rank {rank} on host {mine.host} cannot reach the peer watch of rank {endpoint.rank} "
                            f"on host {endpoint.host} ({error})")
            continue
        peers[endpoint.rank] = _Peer(endpoint, address, outgoing, time.monotonic())
    everyone = [problem for found in allgather_object(problems) for problem in found]
    if everyone:
        for peer in peers.values():
            peer.outgoing.close()
        listener.close()
        raise PeerWatchError(f"{everyone[0]}: open TCP between the hosts, or set {TIMEOUT_VARIABLE}=0 to run "
                             f"without the peer watch")
    return PeerWatch(rank, timeout_s, listener, token, peers, before_exit)
