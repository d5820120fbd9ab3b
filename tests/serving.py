"""A ds2-serve app on a free loopback port for a test's duration (tests/test_serve.py, test_page.py)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(engine, **limits):
    """Yields the base URL (http://127.0.0.1:<port>) of make_app(engine, Limits(**limits)) under
    uvicorn in a thread, as ds2-serve configures it (server.uvicorn_config); stops it after."""
    import uvicorn

    from ds2_jax.serve import app as app_lib
    from ds2_jax.serve import limits as limits_lib
    from ds2_jax.serve import server as server_lib

    checked = limits_lib.checked(**limits)
    port = free_port()
    config = server_lib.uvicorn_config(  # ds2-serve's own settings
        app_lib.make_app(engine, checked),
        checked,
        port=port,
        log_config=None,  # uvicorn's own would bind handlers to pytest's captured stderr
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
