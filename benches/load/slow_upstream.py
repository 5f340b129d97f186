#!/usr/bin/env python3
"""A keep-alive HTTP/1.1 upstream that answers `200 ok` after DELAY seconds: the
application behind idemgate, for the async-mode acknowledgement benchmark.

    slow_upstream.py PORT DELAY
"""
import asyncio
import sys


async def handle(reader, writer):
    delay = float(sys.argv[2])
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            if length:
                await reader.readexactly(length)
            if delay > 0:
                await asyncio.sleep(delay)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    async with server:
        await server.serve_forever()


asyncio.run(main())
