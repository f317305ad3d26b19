"""The FastAPI app factory. It needs only a repository: the app never talks to Ray."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI

from api.errors import install_error_handlers
from api.routes import router as api_router
from api.status_page import router as page_router
from scheduler.store import JobRepository

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


def create_app(repo: JobRepository, *, lifespan: Lifespan | None = None) -> FastAPI:
    app = FastAPI(
        title="Gangway",
        version="0.1.0",
        description="Schedule and run distributed PyTorch training on GPU clusters.",
        lifespan=lifespan,
    )
    app.state.repo = repo
    install_error_handlers(app)
    app.include_router(api_router)
    app.include_router(page_router)
    return app
