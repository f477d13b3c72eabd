"""benchmarks/traffic.py's byte attribution: `ss` parsing and per-direction sums (no cluster)."""

import os
import socket
import subprocess
import sys
import time

import pytest

from benchmarks import traffic

SS = """ESTAB 0      0          127.0.0.1:5000  127.0.0.1:40001 users:(("python",pid=10,fd=7))
\t cubic wscale:7,7 rto:204 bytes_sent:10 bytes_acked:11 bytes_received:1200 segs_out:4
ESTAB 0      0          127.0.0.1:40001 127.0.0.1:5000  users:(("python",pid=20,fd=9))
\t cubic wscale:7,7 rto:204 bytes_sent:1200 bytes_acked:1201 bytes_received:300 segs_out:4
ESTAB 0      0      [::ffff:127.0.0.1]:6000 [::ffff:127.0.0.1]:40002 users:(("python",pid=20,fd=3))
\t cubic rto:204 bytes_received:77
ESTAB 0      0          127.0.0.1:40002 127.0.0.1:6000  users:(("python",pid=30,fd=4))
\t cubic rto:204
"""


def test_parse_ss_reads_ports_owner_and_bytes_received():
    parsed = traffic.parse_ss(SS)
    assert parsed == {
        (5000, 40001): (10, 1200),
        (40001, 5000): (20, 300),
        (6000, 40002): (20, 77),
        (40002, 6000): (30, 0),  # no bytes_received field: nothing received yet
    }


def test_directed_bytes_counts_only_the_receiver_sockets_whose_peer_is_the_sender():
    after = traffic.parse_ss(SS)
    before = {(5000, 40001): (10, 200)}
    assert traffic.directed_bytes(before, after, sender=20, receiver=10) == 1000  # 1200 - 200
    assert traffic.directed_bytes(before, after, sender=10, receiver=20) == 300
    assert traffic.directed_bytes(before, after, sender=30, receiver=20) == 77
    assert traffic.directed_bytes(before, after, sender=10, receiver=30) == 0


def test_socket_bytes_sees_a_real_loopback_transfer_from_a_child_process():
    try:
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
    except OSError as error:
        pytest.skip(f"loopback sockets are not allowed in this sandbox: {error}")
    server.listen()
    port = server.getsockname()[1]
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                f"import socket, time; s = socket.create_connection(('127.0.0.1', {port})); "
                "s.sendall(b'x' * 123456); time.sleep(30)"
            ),
        ]
    )
    try:
        connection, _ = server.accept()
        got = 0
        while got < 123456:
            got += len(connection.recv(65536))
        time.sleep(0.2)
        sockets = traffic.socket_bytes()
        if not sockets:
            pytest.skip("`ss -tinp` shows no sockets in this sandbox")
        assert traffic.directed_bytes({}, sockets, sender=child.pid, receiver=os.getpid()) == 123456
    finally:
        child.kill()
        child.wait()
        server.close()
