"""`dvfs-mlops clockd serve|install|uninstall|status`: run, install and inspect the clock service.

`install` writes a systemd unit that runs `clockd serve` with this interpreter, creates the group, adds the user who
ran sudo to it, and enables the unit; `uninstall` undoes that (the group stays: it may hold other members). Where
systemctl is missing (a container, CI) the unit is still written and the command says so in one line.
"""
from __future__ import annotations

import dataclasses
import grp
import logging
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError

UNIT_NAME = "dvfs-clockd.service"
UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_GROUP = "dvfs"


@dataclasses.dataclass(frozen=True)
class ClockdOptions:
    """The options of `dvfs-mlops clockd`.

    Attributes:
        socket: the socket (None: $DVFS_CLOCKD_SOCKET, else /run/dvfs-mlops/clockd.sock).
        group: the group the service serves.
        unit_dir: where `install` writes the systemd unit (tests and unusual systems).
    """

    socket: Path | None = None
    group: str = DEFAULT_GROUP
    unit_dir: Path = UNIT_DIR

    @classmethod
    def from_cli(cls, socket: str, group: str, unit_dir: str) -> ClockdOptions:
        """The record from the command line's text (an empty string: the default)."""
        return cls(Path(socket) if socket else None, group, Path(unit_dir) if unit_dir else UNIT_DIR)

    @property
    def socket_path(self) -> Path:
        return self.socket or settings.clockd_socket()


def _dvfs_command() -> list[str]:
    """This installation's command line: the dvfs-mlops script beside this interpreter, else `python -m dvfs_mlops`."""
    script = Path(sys.executable).parent / "dvfs-mlops"
    return [str(script)] if script.exists() else [sys.executable, "-m", "dvfs_mlops"]


def render_unit(options: ClockdOptions) -> str:
    """The systemd unit that runs the service: restarted on failure, its socket folder made by systemd.

    The socket's folder is the unit's RuntimeDirectory (systemd.exec(5): created 0755 under /run when the unit
    starts, removed when it stops) where the socket is the default one; the service creates any other folder itself.
    """
    path = options.socket_path
    runtime = f"RuntimeDirectory={path.parent.name}\nRuntimeDirectoryMode=0755\n" if path.parent.parent == Path("/run") else ""
    root = settings.sysfs_root()
    env = f"Environment=DVFS_SYSFS_ROOT={root}\n" if root != Path("/") else ""  # a chroot's or test tree's, as installed
    command = " ".join([*_dvfs_command(), "clockd", "serve", "--socket", str(path), "--group", options.group])
    return ("[Unit]\n"
            f"Description=dvfs-mlops clock service: members of group {options.group} pin GPU clocks without root\n"
            "After=local-fs.target\n\n"
            "[Service]\n"
            "Type=simple\n"
            f"ExecStart={command}\n"
            f"{runtime}{env}"
            "Restart=on-failure\n"
            "RestartSec=1\n\n"
            "[Install]\n"
            "WantedBy=multi-user.target\n")


def _run(argv: list[str], say: Callable[[str], None]) -> bool:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        say(f"{' '.join(argv)} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}")
    return out.returncode == 0


def install(options: ClockdOptions, say: Callable[[str], None]) -> list[str]:
    """Write and enable the unit, create the group, add the user who ran sudo to it.

    Returns:
        What was done, one line each.

    Raises:
        DvfsError: not root.
    """
    _need_root("install")
    lines = []
    try:
        grp.getgrnam(options.group)
    except KeyError:
        if not shutil.which("groupadd") or not _run(["groupadd", "--system", options.group], say):
            raise DvfsError(f"could not create group {options.group!r}; create it (groupadd --system {options.group}) "
                            "and run install again") from None
        lines.append(f"created group {options.group}")
    user = settings.sudo_user()
    if user and user != "root" and shutil.which("usermod") and _run(["usermod", "-aG", options.group, user], say):
        lines.append(f"added {user} to group {options.group}: log in again (or run 'newgrp {options.group}') to use it")
    options.unit_dir.mkdir(parents=True, exist_ok=True)
    unit = options.unit_dir / UNIT_NAME
    unit.write_text(render_unit(options))
    unit.chmod(0o644)
    lines.append(f"wrote {unit}")
    if shutil.which("systemctl") is None:
        lines.append(f"systemctl not found (a container?): start the service yourself: {' '.join(_dvfs_command())} clockd serve")
        return lines
    if _run(["systemctl", "daemon-reload"], say) and _run(["systemctl", "enable", "--now", UNIT_NAME], say):
        lines.append(f"enabled and started {UNIT_NAME}; socket {options.socket_path}")
    return lines


def uninstall(options: ClockdOptions, say: Callable[[str], None]) -> list[str]:
    """Stop and disable the unit, remove its file (the group stays: it may have other uses).

    Returns:
        What was done, one line each.

    Raises:
        DvfsError: not root.
    """
    _need_root("uninstall")
    lines = []
    if shutil.which("systemctl") is None:
        lines.append("systemctl not found (a container?): stop a service you started yourself")
    elif _run(["systemctl", "disable", "--now", UNIT_NAME], say):
        lines.append(f"stopped and disabled {UNIT_NAME}")
    unit = options.unit_dir / UNIT_NAME
    if unit.exists():
        unit.unlink()
        lines.append(f"removed {unit}")
        if shutil.which("systemctl") is not None:
            _run(["systemctl", "daemon-reload"], say)
    else:
        lines.append(f"no unit at {unit}")
    lines.append(f"group {options.group} kept (remove it with 'groupdel {options.group}' if nothing else uses it)")
    return lines


def status(options: ClockdOptions) -> list[str]:
    """The service (systemd's view where there is one), its socket, and every GPU it pins with its owner."""
    from dvfs_mlops.hw.clockd.client import ClockdClient
    from dvfs_mlops.hw.clockd.protocol import Request, group_name

    lines = []
    if shutil.which("systemctl") is not None:
        out = subprocess.run(["systemctl", "is-active", UNIT_NAME], capture_output=True, text=True, check=False)
        lines.append(f"service:  {UNIT_NAME} {out.stdout.strip() or 'unknown'}")
    path = options.socket_path
    try:
        st = os.stat(path)
    except OSError:
        return [*lines, f"socket:   {path} missing: no service (sudo dvfs-mlops clockd install)"]
    group = group_name(st.st_gid)
    lines.append(f"socket:   {path} (group {group}, mode {stat.S_IMODE(st.st_mode):04o})")
    client = ClockdClient(path)
    try:
        reply = client.request(Request("status")).raise_for_error()
    finally:
        client.close()
    lines += [f"pinned:   {p.line()}" for p in reply.pins] or ["pinned:   none"]
    return lines


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise DvfsError(f"clockd {what} writes a systemd unit and a group: run it once as root (sudo dvfs-mlops clockd {what})")


def serve(options: ClockdOptions) -> None:
    """Run the service in the foreground, as root, logging who pinned what to stderr (journald under systemd)."""
    from dvfs_mlops.hw.clockd.server import ServiceConfig
    from dvfs_mlops.hw.clockd.server import serve as run_service

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    run_service(ServiceConfig(options.socket_path, options.group))


def clockd_command(action: str, options: ClockdOptions, say: Callable[[str], None]) -> list[str]:
    """`dvfs-mlops clockd ACTION`: serve (foreground, until stopped), install, uninstall or status.

    Returns:
        The lines to print.

    Raises:
        DvfsError: not root for serve/install/uninstall, no such group, or the service refused.
    """
    if action == "serve":
        serve(options)
        return []
    if action == "install":
        return install(options, say)
    if action == "uninstall":
        return uninstall(options, say)
    return status(options)
