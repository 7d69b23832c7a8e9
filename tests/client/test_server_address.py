"""A server URL without a port (issue 36): "Connection refused" now says which port was tried and which
parity server listens on, and the ``parity upload`` an offline job suggests names that port."""

from __future__ import annotations

import pytest
from parity.client.rest import ParityClient, ServerUnreachable
from parity.client.server_address import unreachable_hint, with_default_port
from parity.client.uploader import BackgroundUploader

from parity.demo import free_port


@pytest.fixture
def port_80_closed() -> None:
    """These tests need nothing on 127.0.0.1:80, as on a workstation; a machine serving it skips them."""
    import socket

    with socket.socket() as sock:
        sock.settimeout(0.5)
        if sock.connect_ex(("127.0.0.1", 80)) == 0:
            pytest.skip("something listens on 127.0.0.1:80")


def test_a_url_without_a_port_gets_the_default_one() -> None:
    assert with_default_port("http://parity.example") == "http://parity.example:8000"
    assert with_default_port("http://parity.example/prefix") == "http://parity.example:8000/prefix"
    assert with_default_port("http://parity.example:9000") is None
    assert "port 443 was tried" in unreachable_hint("https://parity.example")
    assert unreachable_hint("http://127.0.0.1:9000") == ""


def test_unreachable_names_the_port_tried(monkeypatch: pytest.MonkeyPatch, port_80_closed: None) -> None:
    port = free_port()  # nothing listens there: as port 80 on a workstation
    monkeypatch.setattr("parity.client.server_address.DEFAULT_PORT", port)
    with ParityClient("http://127.0.0.1") as api, pytest.raises(ServerUnreachable) as caught:
        api.get_run("r")
    message = str(caught.value)
    assert "server unreachable" in message
    assert f"the URL names no port, so port 80 was tried; parity server listens on {port}" in message
    assert message.endswith(f"http://127.0.0.1:{port}?)")


def test_the_offline_upload_command_names_the_default_port(tmp_path, port_80_closed: None) -> None:
    up = BackgroundUploader("http://127.0.0.1", run_name="n", dump_root=tmp_path, check_s=0.5,
                            close_at_exit=False)  # fmt: skip
    try:
        assert up.offline is not None
        assert "--server http://127.0.0.1:8000 " in up.upload_command()
    finally:
        up.close(1.0)
