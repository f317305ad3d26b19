"""The secret-leak finding of issue 16 as a user meets it: `gangway serve` (embedded Ray,
auth on, a bootstrap admin key and a database URL in its environment) runs a script that
prints its environment. Only the REST API and the SDK's oldest calls are used, so the same
test runs against the commit the finding was made on (e1c70d8), where it fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest

from bench.harness.service import ADMIN_KEY, Service
from gangway import JobState

pytestmark = pytest.mark.ray


@pytest.mark.timeout(600)
def test_a_script_rank_sees_no_service_secret(tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir(mode=0o755)
    tmp_path.chmod(0o755)  # the rank runs as an unprivileged uid: the scripts must be readable
    (scripts / "show_env.py").write_text(
        "import os\nfor name, value in sorted(os.environ.items()):\n    print('ENV', name, value)\n"
    )
    (tmp_path / "service").mkdir()
    database_url = f"sqlite:///{tmp_path}/service/gangway.db"
    service = Service(data_dir=tmp_path / "service", database_url=database_url)
    service.env["GANGWAY_SCRIPT_ROOTS"] = json.dumps([str(scripts)])  # the admins allow it
    try:
        client = service.start()
        body = {
            "name": "env",
            "entrypoint": {"kind": "script", "path": str(scripts / "show_env.py"), "args": []},
        }
        answer = httpx.post(
            f"{service.url}/v1/jobs", json=body, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
        )
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
        done = client.wait(job_id, timeout_s=300, poll_s=0.5)
        assert done.state is JobState.SUCCEEDED, done.error
        text = "\n".join(line.line for line in client.logs(job_id, tail=1000))
        assert "ENV PATH" in text  # the script did print its environment
        leaked = sorted(set(re.findall(r"ENV (GANGWAY_\w+)", text)))
        assert ADMIN_KEY not in text and not leaked, f"the rank saw {leaked}"
        assert "gangway.db" not in text
    finally:
        service.stop()
