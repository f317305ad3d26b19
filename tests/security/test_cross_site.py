"""Attack: with auth off (the embedded default), a web page the user visits posts a
cancel to the service. Browsers send its `Origin`; only the service's own origin (scheme,
host and port) and its allowed host names on the service's own scheme and port may change
anything. The service is served as `gangway serve` does (http://127.0.0.1:8000)."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from tests.integration.test_safety_over_http import BUILTIN, ORIGIN, served


def cancel_from(api: TestClient, origin: str) -> tuple[int, str | None, str]:
    """Submit a job, cancel it with `origin`; the status, the error's field and the
    job's state afterwards."""
    job = api.post("/v1/jobs", json=BUILTIN).json()["id"]
    answer = api.post(f"/v1/jobs/{job}/cancel", headers={"Origin": origin})
    field = answer.json()["error"]["field"] if answer.status_code >= 400 else None
    return answer.status_code, field, api.get(f"/v1/jobs/{job}").json()["state"]


def test_a_page_on_another_port_or_scheme_cannot_cancel_a_job(
    database_url: str, tmp_path: Path
) -> None:
    api = served(database_url, tmp_path, auth=False)
    forged = [
        "http://127.0.0.1:9999",  # another local server (a dev server, a notebook)
        "http://localhost:9999",
        "http://127.0.0.1",  # port 80
        "https://127.0.0.1:8000",  # same host and port, another scheme
        "null",  # a sandboxed frame or a file:// page
        "http://127.0.0.1:notaport",
    ]
    for origin in forged:
        assert cancel_from(api, origin) == (403, "Origin", "PENDING"), origin
    for origin in (ORIGIN, "http://localhost:8000", "http://[::1]:8000"):
        assert cancel_from(api, origin) == (200, None, "CANCELLED"), origin


def test_an_allowed_host_counts_on_the_services_own_scheme_and_port(
    database_url: str, tmp_path: Path
) -> None:
    """GANGWAY_ALLOWED_HOSTS names hosts; the port is the one the service is served on."""
    app = served(database_url, tmp_path, auth=False, allowed_hosts=["gw.lan"]).app
    direct = TestClient(app, base_url="http://gw.lan:8000", raise_server_exceptions=False)
    assert cancel_from(direct, "http://gw.lan:8000")[0] == 200
    assert cancel_from(direct, "http://gw.lan:9999") == (403, "Origin", "PENDING")
    assert cancel_from(direct, "http://gw.lan") == (403, "Origin", "PENDING")
    # Behind a TLS proxy on the default port: https://gw.lan, never http://gw.lan.
    proxied = TestClient(app, base_url="https://gw.lan", raise_server_exceptions=False)
    assert cancel_from(proxied, "https://gw.lan")[0] == 200
    assert cancel_from(proxied, "https://gw.lan:443")[0] == 200
    assert cancel_from(proxied, "http://gw.lan") == (403, "Origin", "PENDING")
    assert cancel_from(proxied, "https://gw.lan:8443") == (403, "Origin", "PENDING")
