"""The last lines of a command that wrote runs: where to look in the MLflow UI, and how to start it for a local store."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dvfs_mlops.mlops.tracking import UiLink

log = logging.getLogger(__name__)


def link_lines(make: Callable[[], UiLink | None]) -> list[str]:
    """The MLflow UI lines of a link: 'start the MLflow UI: ...' and 'then open: URL' for a local store, else
    'open in the MLflow UI: URL'.

    Args:
        make: builds the `tracking.UiLink` (it may ask the store); None when there is nothing to link to.

    Returns:
        The lines; none when there is no link or building it failed (the command's work is done and logged, only
        the link is missing).
    """
    try:
        link = make()
    except Exception as e:  # noqa: BLE001 - the work is done and logged; only the link is missing
        log.debug("no MLflow UI link: %s", e)
        return []
    if link is None:
        return []
    if link.start:
        return [f"start the MLflow UI: {link.start}", f"then open: {link.url}"]
    return [f"open in the MLflow UI: {link.url}"]


def run_link_lines(run_id: str) -> list[str]:
    """The UI lines of one run's page."""
    from dvfs_mlops.mlops import tracking

    return link_lines(lambda: tracking.run_link(run_id))


def version_link_lines(version: int | str) -> list[str]:
    """The UI lines of a version of the registry's governor model."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import load_config

    return link_lines(lambda: tracking.model_version_link(load_config().name, version))


def production_link_lines() -> list[str]:
    """The UI lines of the version that the registry's production alias points at now (none when no version has it)."""
    from dvfs_mlops.mlops import tracking
    from dvfs_mlops.mlops.registry import load_config

    def make() -> UiLink | None:
        cfg = load_config()
        return tracking.model_version_link_by_alias(cfg.name, cfg.production)

    return link_lines(make)
