"""Node configuration, where users import it from (:class:`NodeConfig`; defined beside the
runtime that reads it, :mod:`pulsar.runtime.node_config`)."""

from .runtime.node_config import PROTOCOLS, NodeConfig

__all__ = ["PROTOCOLS", "NodeConfig"]
