"""The broker's settings: defaults that run on a laptop, overridden by a YAML file
(DIRECTLOG_CONFIG or --config), then by DIRECTLOG_* environment variables, then by
command-line flags."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)


class BrokerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DIRECTLOG_", extra="forbid")

    node_id: int = Field(0, ge=0)
    host: str = "127.0.0.1"
    port: int = Field(9092, ge=0, le=65535)
    advertised_host: str | None = None  # what Metadata tells clients; host if unset
    data_dir: Path = Path("data")
    metrics_port: int = Field(9308, ge=0, le=65535)  # 0 picks a free port
    auto_create_topics: bool = True
    default_partitions: int = Field(1, ge=1)
    socket_request_max_bytes: int = Field(100 * 1024 * 1024, ge=1024)
    log_defaults: dict[str, str] = Field(default_factory=dict)  # topic configs, Kafka names
    housekeeping_interval_ms: int = Field(1000, ge=10)  # flush.ms and retention checks

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("DIRECTLOG_CONFIG")
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> BrokerSettings:
        if config_file is not None:
            os.environ["DIRECTLOG_CONFIG"] = str(config_file)
        return cls(**{k: v for k, v in overrides.items() if v is not None})
