"""The status page in a real headless Chromium (Debian's package, driven by Playwright),
against a real `gangway serve` and Ray: a job waits in the queue, runs on GPUs the cluster
view shows, and reaches SUCCEEDED with its loss chart drawn (every step); no console
errors on the way.
Screenshots of each view are saved under artifacts/screenshots/ (GANGWAY_ARTIFACTS_DIR).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.harness.service import Service, wait_for
from gangway import Builtin, Function, JobState, Parallelism, Resources

pytestmark = [pytest.mark.ray, pytest.mark.browser]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("GANGWAY_ARTIFACTS_DIR", "artifacts")) / "screenshots"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI"):
            pytest.fail("Chromium is required in CI: scripts/test installs Debian's chromium")
        pytest.skip("no Chromium here (scripts/test installs Debian's chromium package)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def service(tmp_path: Path, ray_cluster: Any) -> Iterator[Service]:
    svc = Service(data_dir=tmp_path, ray_address=ray_cluster.address)
    try:
        yield svc
    finally:
        svc.stop()


def shoot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def test_a_job_waits_runs_and_succeeds_on_the_page(browser: Any, service: Service) -> None:
    client = service.start()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda error: problems.append(str(error)))
    page.goto(service.url + "/")

    # Every GPU held (4 ranks x 2 GPUs), so the training job has to wait in the queue.
    filler = client.submit(
        name="filler",
        parallelism=Parallelism(dp=4),
        resources=Resources(gpus_per_rank=2),
        entrypoint=Function(target="workers.examples:sleep_steps", kwargs={"steps": 3000}),
    )
    wait_for(client, filler.id, "stepping")
    job = client.submit(
        name="browser-demo",
        parallelism=Parallelism(dp=2),
        entrypoint=Builtin(model="gpt-tiny", steps=80),
    )
    queue = page.locator("#queue")
    queue.get_by_text("browser-demo").wait_for(timeout=15_000)
    queue.get_by_text("needs 2 GPUs").wait_for(timeout=15_000)  # the scheduler's reason
    shoot(page, "1-queue-job-waiting")

    filler.cancel()
    cells = page.locator(f'#cluster a.gpu[href="/jobs/{job.id}"]')
    cells.first.wait_for(timeout=60_000)
    assert cells.count() == 2
    wait_for(client, job.id, "stepping", timeout_s=90)
    page.wait_for_function(
        "document.querySelector('#jobs-list progress')?.value > 0", timeout=15_000
    )
    shoot(page, "2-cluster-and-jobs-while-running")

    page.goto(f"{service.url}/jobs/{job.id}")
    page.locator("#log").get_by_text("loss").first.wait_for(timeout=30_000)
    summary = page.locator("#summary")
    summary.locator(".state.SUCCEEDED").wait_for(timeout=120_000)
    assert client.get(job.id).state is JobState.SUCCEEDED
    # The loss chart reaches the last step (the x axis ends at 80) within a refresh or two;
    # it has a point per step the job reported (the last one twice: after its final save).
    loss_chart = page.locator('#charts svg.chart[aria-label="loss"]')
    loss_chart.get_by_text("80", exact=True).wait_for(timeout=15_000)
    points = loss_chart.locator("polyline.line").get_attribute("points")
    assert points is not None and len(points.split()) >= 80
    assert page.locator('#charts svg.chart[aria-label="val_loss"]').count() == 1
    assert "tp 0" in summary.inner_text() and "dp 1" in summary.inner_text()
    page.locator("#events .state.SUCCEEDED").first.wait_for(timeout=15_000)
    shoot(page, "3-job-page-succeeded")

    page.goto(service.url + "/")
    page.locator("#jobs-list .state.SUCCEEDED").first.wait_for(timeout=15_000)
    page.locator("#jobs-list svg.spark").first.wait_for(timeout=15_000)
    shoot(page, "4-overview-after")
    assert problems == [], problems


def test_with_auth_on_the_page_asks_for_a_key_and_cancels_as_that_user(
    browser: Any, tmp_path: Path, ray_cluster: Any
) -> None:
    """A service given a database URL has auth on: the page shows the key form, loads the
    job once given alice's key, and its Cancel button cancels her job as her."""
    service = Service(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path}/g.db",
        ray_address=ray_cluster.address,
    )
    try:
        admin = service.start()
        admin.create_user("alice")
        key = admin.issue_key("alice").secret
        job = admin.submit(
            name="alices-job",
            user="alice",
            entrypoint=Function(target="workers.examples:sleep_steps", kwargs={"steps": 3000}),
        )
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        crashes: list[str] = []
        page.on("pageerror", lambda error: crashes.append(str(error)))
        page.on("dialog", lambda dialog: dialog.accept())  # "Cancel job N?"
        held: list[Any] = []
        page.route(f"**/v1/jobs/{job.id}/logs*", lambda route: hold_first(route, held))
        page.goto(f"{service.url}/jobs/{job.id}")
        page.locator("#key-form").wait_for(state="visible", timeout=15_000)
        page.fill("#key-input", key)
        page.click("#key-form button")
        cancel = page.locator(f'button[data-cancel="{job.id}"]')
        cancel.wait_for(timeout=15_000)
        # The log poll sent before the key was given answers 401 only now; the log tail
        # sends the next one (with the key) only after it has handled that answer.
        assert held, "the first log poll was never intercepted"
        logs = f"/v1/jobs/{job.id}/logs"
        with page.expect_request(lambda r: logs in r.url and "authorization" in r.headers):
            held[0].continue_()
        assert page.locator("#key-form").is_hidden()
        shoot(page, "5-job-page-with-a-key")
        cancel.click()
        page.locator("#summary .state.CANCELLED").wait_for(timeout=15_000)
        assert admin.get(job.id).state is JobState.CANCELLED
        assert admin.events(job.id)[-1].reason == "cancelled by alice"
        assert crashes == [], crashes
    finally:
        service.stop()


def hold_first(route: Any, held: list[Any]) -> None:
    """Keeps the first request back (the caller lets it go later), lets the rest through."""
    if held:
        route.continue_()
    else:
        held.append(route)
