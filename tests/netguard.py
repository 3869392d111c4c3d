"""The network guard every test runs under, importable without side effects (``conftest`` sets ``HF_HUB_OFFLINE``
when imported): subprocesses a test starts call :func:`forbid_network` themselves, with ``tests/`` on their path."""

from __future__ import annotations


def forbid_network(patch=setattr) -> None:
    """Make a connection to anything but loopback fail at once: ``patch(obj, name, value)`` is pytest's
    ``monkeypatch.setattr`` in a test, plain ``setattr`` in a subprocess a test starts."""
    import ipaddress
    import socket

    real_connect = socket.socket.connect

    def guarded(sock, address, *args):
        host = address[0] if isinstance(address, tuple) else None
        if host is not None:
            try:
                loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = False
            if not loopback:
                raise OSError(f"tests must not reach the network (tried {host})")
        return real_connect(sock, address, *args)

    patch(socket.socket, "connect", guarded)
