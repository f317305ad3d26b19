"""The status page at `/`: jobs and cluster at a glance, rendered from the store."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates

from api.routes import Repo, get_cluster, list_jobs

router = APIRouter()
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def status_page(request: Request, repo: Repo) -> HTMLResponse:
    cluster = get_cluster(repo)
    jobs = list_jobs(repo, state=None, limit=100, cursor=None).items
    colors = {
        job_id: f"hsl({(job_id * 67) % 360} 65% 55%)" for n in cluster.nodes for job_id in n.jobs
    }
    return templates.TemplateResponse(
        request, "status.html", {"cluster": cluster, "jobs": jobs, "colors": colors}
    )
