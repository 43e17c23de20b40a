"""One way for the server tests to run the app: uvicorn in a thread on a free loopback port."""

import contextlib
import socket
import threading
import time

import httpx
import uvicorn


@contextlib.contextmanager
def running(app, log_level="warning"):
    """Serve `app` on a free port until the block ends; yields its base URL once /health answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # the port is ours before uvicorn starts: no race for it
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(app, log_level=log_level))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not answer /health within 30 s"
            time.sleep(0.05)
        yield url
    finally:
        server.should_exit = True
        thread.join(10)
