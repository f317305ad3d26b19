"""Each job's upstream and downstream jobs, for readers (the job page, `gangway explain`,
the SDK). What a submit may name is checked in `api.dependency_checks`."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.auth import current_caller
from api.routes import ERROR_RESPONSES, JobId, Repo
from gangway.models import DependencyLink, JobDependencies
from scheduler.store.dependencies import Link

router = APIRouter(dependencies=[Depends(current_caller)])


def _link(link: Link) -> DependencyLink:
    return DependencyLink(
        job=link.job_id,
        name=link.name,
        state=link.state,
        on=link.condition.value,
        waiting=link.waiting,
        met_at=link.met_at,
    )


@router.get(
    "/v1/jobs/{job_id}/dependencies", response_model=JobDependencies, responses=ERROR_RESPONSES
)
def get_dependencies(job_id: JobId, repo: Repo) -> JobDependencies:
    """The jobs this one waits (or waited) for, and the jobs that wait for it, each with
    the condition and whether it still waits or was met (when)."""
    repo.get(job_id)  # 404 for an unknown job
    links = repo.links(job_id)
    return JobDependencies(
        upstream=[_link(link) for link in links.upstream],
        downstream=[_link(link) for link in links.downstream],
    )
