"""The settings pattern every service shares: a typed pydantic model read from keyword
overrides, then ``DIRECTLOG_*`` environment variables, then a YAML file."""

from __future__ import annotations

import os
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Self

from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    YamlConfigSettingsSource,
)

# The YAML file `load` was given, seen by the sources while that one call builds the settings
# (the process environment stays as it was).
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("config_file", default=None)


class ServiceSettings(BaseSettings):
    """Subclasses set ``model_config`` (their env prefix) and ``config_env``, the
    environment variable that names their YAML file."""

    config_env: ClassVar[str]

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
        config_file = _CONFIG_FILE.get() or os.environ.get(cls.config_env)
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
        return tuple(sources)

    @classmethod
    def load(cls, config_file: Path | None = None, **overrides: Any) -> Self:
        """Settings from ``config_file`` (when given), the environment and ``overrides``
        (None values are left out, so unset command-line flags change nothing)."""
        token = _CONFIG_FILE.set(config_file)
        try:
            return cls(**{k: v for k, v in overrides.items() if v is not None})
        finally:
            _CONFIG_FILE.reset(token)
