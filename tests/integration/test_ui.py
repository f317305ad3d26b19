"""The status page's HTML: shells, and the fragments the page polls, from a real store."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.auth import AuthConfig
from api.ui import PAGE_SIZE
from scheduler.model import JobState, Node
from scheduler.store import JobRepository, NewJob, ProgressPoint

SPEC = {
    "name": "j",
    "parallelism": {"dp": 2, "tp": 1, "pp": 1},
    "resources": {"gpus_per_rank": 1, "cpus_per_rank": 1.0},
    "entrypoint": {"kind": "builtin", "steps": 10},
}


@pytest.fixture
def page(repo: JobRepository) -> Iterator[TestClient]:
    repo.replace_nodes([Node("n1", "local-1", 4, 8.0), Node("n2", "local-2", 4, 8.0)])
    with TestClient(create_app(repo), raise_server_exceptions=False) as client:
        yield client


def add_job(repo: JobRepository, name: str, **fields: object) -> int:
    new = NewJob(name=name, queue="default", priority=0, spec=SPEC, num_gpus=2, total_steps=10)
    job_id = repo.create(new).id
    for key, value in fields.items():
        repo.annotate(job_id, "test", **{key: value})
    return job_id


def run_on(repo: JobRepository, job_id: int, placement: list[str]) -> None:
    for state in (JobState.ADMITTED, JobState.STARTING, JobState.RUNNING):
        repo.transition(job_id, state, reason="test", placement=placement)


def test_shells_are_open_and_fragments_need_a_key_when_auth_is_on(repo: JobRepository) -> None:
    app = create_app(repo, auth=AuthConfig(required=True, admin_key="k" * 16))
    with TestClient(app, raise_server_exceptions=False) as client:
        for shell in ("/", "/jobs/1", "/static/gangway.js", "/static/gangway.css"):
            assert client.get(shell).status_code == 200, shell
        for fragment in ("/ui/cluster", "/ui/queue", "/ui/jobs", "/ui/jobs/1/summary"):
            assert client.get(fragment).status_code == 401, fragment
        key = {"Authorization": f"Bearer {'k' * 16}"}
        assert client.get("/ui/cluster", headers=key).status_code == 200


def test_the_overview_shell_names_every_section_and_loads_no_remote_asset(
    page: TestClient,
) -> None:
    html = page.get("/").text
    assert all(f'data-src="/ui/{name}"' in html for name in ("cluster", "queue", "jobs"))
    assert not re.search(r'(src|href)="(https?:)?//', html)  # everything from the service
    js = page.get("/static/gangway.js")
    assert js.headers["content-type"].startswith(("text/javascript", "application/javascript"))


def test_cluster_cells_show_which_job_holds_each_gpu(page: TestClient, repo: JobRepository) -> None:
    job_id = add_job(repo, "holder")
    run_on(repo, job_id, ["n1", "n1"])
    html = page.get("/ui/cluster").text
    assert html.count('class="gpu free"') == 6
    assert html.count(f'href="/jobs/{job_id}" style="background') == 2
    assert f"GPU 0: job {job_id} holder" in html and "GPU 2: free" in html
    assert "<strong>2</strong> of 8 GPUs allocated (25%)" in " ".join(html.split())


def test_a_hundred_nodes_are_paged(page: TestClient, repo: JobRepository) -> None:
    repo.replace_nodes([Node(f"id-{i:03d}", f"node-{i:03d}", 8, 8.0) for i in range(100)])
    first = page.get("/ui/cluster").text
    assert first.count("<tr") == PAGE_SIZE + 1  # header + one page
    assert "page 1 of 5" in first and "node-000" in first and "node-020" not in first
    last = page.get("/ui/cluster", params={"page": 5}).text
    assert "node-099" in last and "page 5 of 5" in last
    beyond = page.get("/ui/cluster", params={"page": 9}).text
    assert "page 5 of 5" in beyond and "node-099" in beyond  # the last page, numbered so


def test_the_queue_is_in_scheduling_order_with_reasons_and_eta(
    page: TestClient, repo: JobRepository
) -> None:
    later, sooner = add_job(repo, "later"), add_job(repo, "sooner")
    now = repo.now()
    for job_id, position, eta in ((later, 2, None), (sooner, 1, now + timedelta(minutes=5))):
        why = {"blocker": "cluster_full", "message": f"m{job_id}", "unblock": "u"}
        why["queue_position"] = position
        reason = f"needs 2 GPUs; waiting (#{position})"
        repo.explain_wait(job_id, reason, explanation=why, estimated_start_at=eta)
    html = page.get("/ui/queue").text
    assert html.index("sooner") < html.index("later")
    assert "needs 2 GPUs; waiting (#1)" in html
    assert "in 4m" in html or "in 5m" in html
    assert "unknown" in html  # no estimate for the second
    assert "2 pending" in html


def test_jobs_rows_show_progress_loss_trend_and_filters(
    page: TestClient, repo: JobRepository
) -> None:
    done = add_job(repo, "trained")
    run_on(repo, done, ["n1", "n2"])
    for step in range(1, 6):
        repo.record_progress(done, 1, ProgressPoint(step, loss=5.0 - step, tokens_per_s=1234.0))
    add_job(repo, "waiting")
    html = page.get("/ui/jobs").text
    row = html[html.index("trained") : html.index("</tr>", html.index("trained"))]
    assert '<progress max="10" value="5">' in row and "1,234" in row
    assert re.search(r'<svg class="spark"[^>]*><polyline points="([\d.]+,[\d.]+ ?){5}"', row)
    running = page.get("/ui/jobs", params={"state": "RUNNING"}).text
    assert "trained" in running and "waiting" not in running
    assert "waiting" not in page.get("/ui/jobs", params={"user": "nobody"}).text


def test_jobs_are_paged_by_cursor(page: TestClient, repo: JobRepository) -> None:
    ids = [add_job(repo, f"job-{i}") for i in range(PAGE_SIZE + 3)]
    first = page.get("/ui/jobs").text
    cursor = re.search(r'href="\?cursor=(\d+)"', first)
    assert cursor is not None and int(cursor.group(1)) == ids[3]
    older = page.get("/ui/jobs", params={"cursor": cursor.group(1)}).text
    assert [f"job-{i}" in older for i in range(3)] == [True] * 3 and "older" not in older


def test_the_job_page_shows_placement_by_mesh_axis_cancel_and_the_timeline(
    page: TestClient, repo: JobRepository
) -> None:
    job_id = add_job(repo, "mine")
    run_on(repo, job_id, ["n1", "n2"])
    summary = page.get(f"/ui/jobs/{job_id}/summary").text
    assert f'data-cancel="{job_id}"' in summary
    assert "<td>1</td><td>local-2</td><td>pp 0</td><td>dp 1</td><td>tp 0</td>" in summary
    events = page.get(f"/ui/jobs/{job_id}/events").text
    assert events.index("RUNNING") < events.index("submitted")  # newest first
    page.post(f"/v1/jobs/{job_id}/cancel")
    assert "data-cancel" not in page.get(f"/ui/jobs/{job_id}/summary").text
    assert page.get("/ui/jobs/999/summary").status_code == 404


def test_charts_draw_every_point_and_mark_each_resume(
    page: TestClient, repo: JobRepository
) -> None:
    job_id = add_job(repo, "charted")
    for attempt, steps in ((1, range(1, 4)), (2, range(3, 7))):
        for step in steps:
            point = ProgressPoint(step, loss=10.0 / step, tokens_per_s=100.0, step_time_s=0.5)
            repo.record_progress(job_id, attempt, point)
    html = page.get(f"/ui/jobs/{job_id}/charts").text
    lines = re.findall(r'<polyline class="line" points="([^"]+)"', html)
    assert len(lines) == 3 and all(len(line.split()) == 7 for line in lines)
    assert html.count('class="break"') == 3  # attempt 2 began at step 3, on each chart
    assert "loss (latest 1.67)" in html


def test_recent_losses_are_the_last_points_of_each_job(repo: JobRepository) -> None:
    first, second, silent = add_job(repo, "a"), add_job(repo, "b"), add_job(repo, "c")
    for step in range(1, 41):
        repo.record_progress(first, 1, ProgressPoint(step, loss=float(step)))
    repo.record_progress(second, 1, ProgressPoint(1, loss=None))
    repo.record_progress(second, 1, ProgressPoint(2, loss=7.0))
    trends = repo.recent_losses([first, second, silent], points=30)
    assert trends == {first: [float(s) for s in range(11, 41)], second: [7.0]}
    assert repo.recent_losses([]) == {}
