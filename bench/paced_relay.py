#!/usr/bin/env python3
"""A TCP relay that holds every connection to its own rate, for the benchmarks.

    bench/paced_relay.py LISTEN_PORT UPSTREAM_PORT BYTES_PER_SECOND

Each accepted connection is relayed to 127.0.0.1:UPSTREAM_PORT. The kernel paces what the relay
sends back to the client on that connection (SO_MAX_PACING_RATE on the accepted socket), so every
TCP connection gets at most BYTES_PER_SECOND, like a shaper per flow on a real path, while TLS and
HTTP/2 run end to end between the client and the server. The relay copies bytes and does nothing
else; the pacing costs it no CPU.
"""
import asyncio
import socket
import sys

SO_MAX_PACING_RATE = getattr(socket, "SO_MAX_PACING_RATE", 47)
BUFFER = 256 * 1024


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            data = await reader.read(BUFFER)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def relay(client_reader, client_writer, upstream_port: int, rate: int) -> None:
    client = client_writer.get_extra_info("socket")
    client.setsockopt(socket.SOL_SOCKET, SO_MAX_PACING_RATE, rate)
    client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", upstream_port)
    except OSError:
        client_writer.close()
        return
    await asyncio.gather(pipe(client_reader, upstream_writer), pipe(upstream_reader, client_writer))


async def main() -> None:
    listen_port, upstream_port, rate = (int(value) for value in sys.argv[1:4])
    server = await asyncio.start_server(
        lambda r, w: relay(r, w, upstream_port, rate), "127.0.0.1", listen_port, limit=BUFFER, backlog=256)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main())
