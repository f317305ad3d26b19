"""Service settings, from `GANGWAY_*` environment variables; built in `main`, not at import."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GANGWAY_", extra="ignore")

    data_dir: Path = Field(Path("~/.gangway"), description="SQLite file and logs live here")
    database_url: str = Field("", description="SQLAlchemy URL; empty = SQLite in data_dir")
    ray_address: str = Field("", description="Ray cluster to join; empty = start a local one")
    local_nodes: int = Field(2, ge=1, le=16, description="logical GPU nodes of the local Ray")
    local_gpus_per_node: int = Field(4, ge=1, le=16)
    local_cpus_per_node: int = Field(8, ge=1, le=256)
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    schedule_interval_s: float = Field(1.0, gt=0, le=60)
    placement_timeout_s: float = Field(120.0, gt=0)

    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.data_dir.expanduser() / 'gangway.db'}"
