"""The model server's connections (worker/model_http.py): a request goes out in one send, and
over TLS as over plain TCP the model answers; a connection the server closed is not reused."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from httpcore2._backends.sync import SyncStream

from tests.test_model_calls import COMPLETION, QUESTION
from worker.model import ModelClient
from worker.model_http import HELD_BYTES, OneWriteStream


@pytest.fixture
def pair() -> Iterator[tuple[OneWriteStream, socket.socket]]:
    ours, theirs = socket.socketpair()
    stream = OneWriteStream(SyncStream(ours))
    yield stream, theirs
    stream.close()
    theirs.close()


def nothing_came(sock: socket.socket) -> bool:
    try:
        sock.recv(65536, socket.MSG_DONTWAIT)
    except BlockingIOError:
        return True
    return False


def test_a_request_is_sent_whole_in_one_send_when_its_reply_is_read(pair):
    stream, server = pair
    stream.write(b"POST /v1/chat/completions HTTP/1.1\r\nContent-Length: 4\r\n\r\n", 5.0)
    stream.write(b"body", 5.0)
    stream.write(b"", 5.0)  # h11's end of a message of known length
    assert nothing_came(server)  # held until the reply is read
    server.sendall(b"HTTP/1.1 200 OK\r\n")
    assert stream.read(65536, 5.0) == b"HTTP/1.1 200 OK\r\n"
    assert server.recv(65536, socket.MSG_DONTWAIT).endswith(b"\r\n\r\nbody")  # in one


def test_a_large_body_goes_as_it_comes_not_held_whole(pair):
    stream, server = pair
    stream.write(b"POST / HTTP/1.1\r\n\r\n", 5.0)
    stream.write(b"x" * HELD_BYTES, 5.0)
    assert not nothing_came(server)


def test_a_failed_write_is_read_past_as_httpcore2_does(pair):
    stream, server = pair
    server.sendall(b"HTTP/1.1 413 Payload Too Large\r\n")
    server.shutdown(socket.SHUT_RD)
    stream._stream._sock.shutdown(socket.SHUT_WR)  # the write that follows fails (EPIPE)
    stream.write(b"POST / HTTP/1.1\r\n\r\n", 5.0)
    assert stream.read(65536, 5.0) == b"HTTP/1.1 413 Payload Too Large\r\n"


def test_a_connection_the_server_closed_reads_as_readable_and_an_idle_one_not(pair):
    stream, server = pair
    assert stream.get_extra_info("is_readable") is False
    server.close()
    assert stream.get_extra_info("is_readable") is True


@pytest.fixture
def tls_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, list]]:
    """An HTTPS server answering every chat request with COMPLETION; what each of its reads
    received, by connection, is listed."""
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "ca.pem"))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert.configure_cert(context)
    listener = socket.create_server(("127.0.0.1", 0))
    reads: list[list[bytes]] = []
    body = json.dumps(COMPLETION).encode()
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
    reply += b"Content-Length: %d\r\n\r\n" % len(body) + body

    def serve(conn: ssl.SSLSocket) -> None:
        mine: list[bytes] = []
        reads.append(mine)
        pending = b""
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                mine.append(data)
                pending += data
                head, found, rest = pending.partition(b"\r\n\r\n")
                length = [x for x in head.split(b"\r\n") if x.lower().startswith(b"content-length")]
                if found and len(rest) >= int(length[0].split(b":")[1]):
                    pending = b""
                    conn.sendall(reply)

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                wrapped = context.wrap_socket(conn, server_side=True)
                threading.Thread(target=serve, args=(wrapped,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield f"https://127.0.0.1:{listener.getsockname()[1]}/v1", reads
    listener.close()


def test_a_model_server_over_tls_gets_each_request_in_one_read_and_answers(tls_model):
    url, reads = tls_model
    client = ModelClient(model="gpt-fake", api_key="sk-x", base_url=url, max_retries=0)
    for _ in range(2):
        assert client.complete(QUESTION, [], 5.0, max_tokens=8).content == "It is 5."
    [connection] = reads  # the second request on the connection the first opened
    assert len(connection) == 2  # each request (head and body) came in one read
    assert all(b"\r\n\r\n{" in read for read in connection)
