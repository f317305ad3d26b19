"""A service whose own Ray node is declared dead stops and exits 1 saying why (a service
manager restarts it and it reattaches), not killed by its own SIGTERM, which reads as a
clean stop."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

RUN = """
import sys, threading
from api import server
from api.settings import Settings
from scheduler.runtime.cluster import DriverNodeLost

def start(self):
    lost = DriverNodeLost("the Ray head declared this service's node dead")
    threading.Timer(1.0, self._fail, args=(lost,)).start()

server.Runtime.start = start
server.Runtime.stop = lambda self: None
server.serve(Settings(data_dir=sys.argv[1], port=int(sys.argv[2])))
"""


def test_a_service_whose_ray_node_is_lost_exits_1_saying_why(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(tmp_path), str(port)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    assert "gangway serve stopped: the Ray head declared this service's node dead" in done.stderr
