"""uvicorn's HTTP protocol with bounded send buffers.

Invariant: a connection holds little that is written but unread. In user space asyncio pauses the protocol as soon
as the kernel does not take a whole write (high-water mark 0), so at most one write (part of one SSE event) waits
there; in the kernel the socket's send buffer has a fixed size (`SO_SNDBUF`, `--socket-sndbuf`, default 64 KiB as
requested, which Linux doubles) instead of autotuning up to megabytes. So a client that stops reading stalls its
stream within a bounded number of events, and the gate's revocation check (`gate.ResponseGate`) stays close to the
wire: after a SUPERSEDE is accepted, what the client can still read of the old version is only what was already
written, bounded by these buffers, and an outside observer can account for every byte of it (`/proc/net/tcp`).
"""
from __future__ import annotations

import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

SNDBUF = 64 * 1024


class GatedHttpProtocol(HttpToolsProtocol):
    sndbuf: int = SNDBUF  # 0 leaves the kernel's autotuning on

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=0)
        sock = transport.get_extra_info("socket")
        if self.sndbuf and sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.sndbuf)


def protocol(sndbuf: int) -> type:
    return type("GatedHttpProtocol", (GatedHttpProtocol,), {"sndbuf": int(sndbuf)})
