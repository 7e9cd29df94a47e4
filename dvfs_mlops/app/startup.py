"""What every command does before it runs: the command line's defaults, quiet third-party loggers, and (under sudo)
giving the user's files back when it ends."""
from __future__ import annotations

import logging
from collections.abc import Callable

from dvfs_mlops import settings

NOISY_LOGGERS = ("mlflow.store.db.utils", "alembic", "mlflow.tracking.fluent")


def begin_command() -> Callable[[], None]:
    """Set the command line's defaults (`settings.CLI_DEFAULTS`: no progress bars redrawn with \\r in a command's output)
    and quiet MLflow's and alembic's INFO chatter.

    Returns:
        What to call once the command ends, however it ends (`ownership.after_command`: under sudo, the files it made in
        the user's tree go back to the user).
    """
    from dvfs_mlops.app import ownership

    settings.set_defaults(settings.CLI_DEFAULTS)
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return ownership.after_command()
