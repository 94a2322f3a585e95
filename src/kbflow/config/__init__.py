"""Configuration: the typed schema every run is validated against (``schema``), the embedder sections
(``embedders``), remote connections (``connection``), how an operation resolves a config and data dir
(``resolve``) and ``kbflow config show`` (``show``).

The classes and loaders users and the docs name are importable from here: ``from kbflow.config import KbConfig,
load_config``.
"""

from kbflow.config.embedders import EmbedderConfig
from kbflow.config.schema import (ENV_PREFIX, NAMESPACE_RE, AgenticConfig, ChunkConfig, ConvertConfig,
                                  DeployConfig, FlowConfig, GraphConfig, KbConfig, LlmConfig, McpConfig, Origins,
                                  RerankConfig, RunnerConfig, ScheduleConfig, SearchConfig, StoreConfig, WebConfig,
                                  check_namespace, load_config, load_config_with_origins)

__all__ = ["ENV_PREFIX", "NAMESPACE_RE", "AgenticConfig", "ChunkConfig", "ConvertConfig",
           "DeployConfig", "EmbedderConfig", "FlowConfig", "GraphConfig", "KbConfig", "LlmConfig", "McpConfig",
           "Origins", "RerankConfig", "RunnerConfig", "ScheduleConfig", "SearchConfig", "StoreConfig", "WebConfig",
           "check_namespace", "load_config", "load_config_with_origins"]
