"""How the clock service runs: where it listens, for whom, for how long, and what its administrator allows.

Two sources, each fact in one: the command line (`clockd serve --socket --group --max-lease`: `ServiceConfig`) and a
root-owned config file (`etc/dvfs-mlops/clockd.conf` under $DVFS_SYSTEM_STATE_PREFIX, an INI file: `RootConfig`),
which says which NVML GPUs the group may lock, whether those GPUs may be assumed unlocked, and the connection limits.
The file is read at start and again on SIGHUP; a file that is not root's, is writable by others or lies behind a
symbolic link is refused (the service keeps what it had). A missing file means the defaults: every GPU, none assumed
unlocked (so an NVML pin needs the administrator's word first), the limits of `RootConfig`. The file `clockd install`
writes where none exists is `EXAMPLE_CONFIG`: each key with its default, explained.
"""
from __future__ import annotations

import configparser
import dataclasses
import os
import stat
from pathlib import Path
from typing import Any

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError, StateFolderError
from dvfs_mlops.hw.guard import FILE_FLAGS, open_trusted_dir

CONFIG_FILE = "etc/dvfs-mlops/clockd.conf"
# A long fine-tune fits: the slowest job the project runs (a LoRA fine-tune of a 1-3B model on an Orin NX/Nano)
# takes hours, well under a day; the pin of a client that keeps renewing forever ends within a day.
DEFAULT_MAX_LEASE_S = 24 * 3600.0
DEFAULT_IDLE_TIMEOUT_S = 60.0
RENEWS_PER_TIMEOUT = 12  # a client renews every idle_timeout/12 (5 s at the default): a few lost renews end nothing
EXAMPLE_CONFIG = """\
# dvfs-mlops clock service: what members of its group may do. Root's file: only root may write it.
# Read when the service starts and again on `systemctl reload dvfs-clockd` (SIGHUP).

[nvml]
# GPUs the group may lock, by UUID (comma-separated), or "all"
gpus = all
# "yes" only where nobody locks these GPUs' clocks by hand (nvidia-smi -lgc): a pin's restore resets any lock
assume_unlocked = no

[service]
# seconds a connection may stay silent (a pinned client renews every idle_timeout/12 s); its pin is then restored
idle_timeout = 60
# open connections one uid may hold (root is not counted), and all uids together
connections_per_uid = 32
connections_total = 256
"""


def config_path() -> Path:
    """The service's root-owned config file (under $DVFS_SYSTEM_STATE_PREFIX)."""
    return settings.system_state_prefix() / CONFIG_FILE


@dataclasses.dataclass(frozen=True)
class NvmlScope:
    """Which NVML GPUs the group may lock, and whether they may be assumed unlocked (`NvmlDevice.assume_unlocked`).

    Attributes:
        gpus: the UUIDs allowed, None for every GPU the service's NVML enumerates.
        assume_unlocked: the administrator's word that nobody locks these GPUs' clocks by hand.
    """

    gpus: tuple[str, ...] | None = None
    assume_unlocked: bool = False

    def allows(self, uuid: str) -> bool:
        return self.gpus is None or uuid in self.gpus

    def describe(self) -> str:
        which = "every GPU" if self.gpus is None else (", ".join(self.gpus) or "no GPU")
        unlocked = "assumed unlocked" if self.assume_unlocked else "not assumed unlocked (nvml pins refused)"
        return f"NVML: {which}, {unlocked}"


@dataclasses.dataclass(frozen=True)
class RootConfig:
    """The config file's content.

    Attributes:
        nvml: the NVML scope.
        idle_timeout_s: a connection silent this long is closed (its pin restored).
        connections_per_uid: open connections one uid other than root may hold; one over it is answered and closed.
        connections_total: the same for all uids together.
        source: the file it came from, or a note that there was none.
    """

    nvml: NvmlScope = NvmlScope()
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    connections_per_uid: int = 32
    connections_total: int = 256
    source: str = "defaults (no config file)"


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """How the service runs (the command line's part).

    Attributes:
        socket_path: where it listens.
        group: the group whose members it serves (the socket file's group).
        nvml_module: a `pynvml`-compatible module (None: nvidia-ml-py where installed; tests pass a fake).
        max_lease_s: the longest one pin may last, renewals included.
        config_file: the root-owned config (None: `config_path()`).
    """

    socket_path: Path
    group: str
    nvml_module: Any = None
    max_lease_s: float = DEFAULT_MAX_LEASE_S
    config_file: Path | None = None


def _read_root_file(path: Path) -> str | None:
    """The text of `path`, a file of root's that nobody else can write, reached without a link; None where missing.

    Raises:
        StateFolderError: not root's, writable by others, a link on the way.
    """
    try:
        dfd = open_trusted_dir(path.parent, "config folder")
    except FileNotFoundError:
        return None
    try:
        try:
            fd = os.open(path.name, os.O_RDONLY | os.O_NONBLOCK | FILE_FLAGS, dir_fd=dfd)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateFolderError(f"refusing the config {path}: {e.strerror or e} (a symbolic link?)") from None
        with os.fdopen(fd) as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
                raise StateFolderError(f"refusing the config {path}: it must be a regular file of root's that only root "
                                       f"writes (owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o})")
            return f.read(65536)
    finally:
        os.close(dfd)


def load_root_config(path: Path) -> RootConfig:
    """Read the config file (module doc).

    Raises:
        DvfsError: the file is not root's own, or a value is not understood (one line naming it).
    """
    text = _read_root_file(path)
    if text is None:
        return RootConfig()
    parser = configparser.ConfigParser(inline_comment_prefixes=("#", ";"))
    try:
        parser.read_string(text, source=str(path))
        gpus = parser.get("nvml", "gpus", fallback="all").strip()
        scope = NvmlScope(None if gpus.lower() == "all" else tuple(g.strip() for g in gpus.split(",") if g.strip()),
                          parser.getboolean("nvml", "assume_unlocked", fallback=False))
        config = RootConfig(scope, parser.getfloat("service", "idle_timeout", fallback=DEFAULT_IDLE_TIMEOUT_S),
                            parser.getint("service", "connections_per_uid", fallback=32),
                            parser.getint("service", "connections_total", fallback=256), str(path))
    except (configparser.Error, ValueError) as e:
        raise DvfsError(f"the clock service's config {path} is not valid ({' '.join(str(e).split())}); see "
                        "`dvfs-mlops clockd --help` for its keys") from None
    bad = [u for u in scope.gpus or () if not u.startswith("GPU-")]
    if bad or config.idle_timeout_s <= 0 or config.connections_per_uid < 1 or config.connections_total < 1:
        raise DvfsError(f"the clock service's config {path} is not valid: GPUs are UUIDs (GPU-...), the idle timeout "
                        f"and the connection limits are positive{f' (not {bad[0]!r})' if bad else ''}")
    return config

