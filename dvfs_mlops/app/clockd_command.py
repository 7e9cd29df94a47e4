"""`dvfs-mlops clockd serve|install|uninstall|status|release`: run, install, inspect and override the clock service.

`install` checks that what the unit would run as root can be changed by root alone (`installation_problems`), writes a
hardened systemd unit (`render_unit`) that runs this interpreter isolated (`python -I -m dvfs_mlops`), writes the
config file where none exists, creates the group, adds the user who ran sudo to it, and enables the unit; `uninstall`
undoes that (the group and the config stay: they may have other uses). Where systemctl is missing (a container, CI)
the unit is still written and the command says so in one line. `release DEVICE` (root) ends any member's pin.
"""
from __future__ import annotations

import dataclasses
import grp
import logging
import os
import re
import shutil
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dvfs_mlops import settings
from dvfs_mlops.errors import DvfsError

if TYPE_CHECKING:
    from dvfs_mlops.hw.clockd.protocol import Reply

UNIT_NAME = "dvfs-clockd.service"
UNIT_DIR = Path("/etc/systemd/system")
DEFAULT_GROUP = "dvfs"
STATE_NAME = "dvfs-mlops"  # /run/dvfs-mlops (RuntimeDirectory: the socket, state/ for locks), /var/lib/dvfs-mlops (journals)
# useradd(8)'s default NAME_REGEX for user and group names, or a number
_GROUP_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}|[0-9]{1,10}")
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*")
_UNITS_S = {None: 1.0, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

# The unit's sandbox (systemd.exec(5)); zeusd's unit is the model (ml-energy/zeus, zeusd/packaging/systemd/
# zeusd.service: NoNewPrivileges, ProtectSystem=strict, CapabilityBoundingSet, RestrictAddressFamilies,
# SystemCallFilter=@system-service). Left off on purpose: ProtectKernelTunables (makes /sys read-only: devfreq writes
# would fail), PrivateDevices (hides /dev/nvidia*), PrivateUsers (the service must be real root for sysfs and NVML),
# ProtectProc=invisible (the service reads other users' /proc/PID for group membership and liveness), ProcSubset=pid
# (the journal's boot id is /proc/sys/kernel/random/boot_id), MemoryDenyWriteExecute (nvidia-ml-py calls NVML through
# ctypes; libffi may need writable+executable trampolines, which cannot be checked without a GPU here).
HARDENING = (
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "ProtectHome=read-only",
    "PrivateTmp=yes",
    "PrivateMounts=yes",
    "PrivateNetwork=yes",
    "IPAddressDeny=any",
    "UMask=0077",
    # NVML's clock locks need CAP_SYS_ADMIN (zeusd's unit, above); the socket folder's and file's group CAP_CHOWN
    "CapabilityBoundingSet=CAP_SYS_ADMIN CAP_CHOWN",
    # the service's socket; NVML talks to the driver through ioctls on /dev/nvidia* and to nvidia-persistenced over AF_UNIX
    "RestrictAddressFamilies=AF_UNIX",
    "SystemCallFilter=@system-service",
    "SystemCallErrorNumber=EPERM",
    "SystemCallArchitectures=native",
    # NVML's device nodes: /dev/nvidiactl and /dev/nvidia<N> are the "nvidia-frontend" major, MIG's capability files
    # "nvidia-caps" (/proc/devices); everything else in /dev but the pseudo devices is closed
    "DevicePolicy=closed",
    "DeviceAllow=char-nvidia-frontend rw",
    "DeviceAllow=char-nvidia-caps r",
    "ProtectKernelModules=yes",
    "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes",
    "ProtectHostname=yes",
    "ProtectClock=yes",
    "RestrictNamespaces=yes",
    "RestrictRealtime=yes",
    "RestrictSUIDSGID=yes",
    "LockPersonality=yes",
    "KeyringMode=private",
    "RemoveIPC=yes",
    # the service caps its connections well below this (RootConfig: 256 in all); threads: one per connection
    "LimitNOFILE=1024",
    "TasksMax=512",
)


def parse_duration(text: str) -> float:
    """Seconds in a duration such as 24h, 90m, 30s, 2d or 3600.

    Raises:
        DvfsError: not a positive duration (one line with examples).
    """
    m = _DURATION.fullmatch(text or "")
    if not m or float(m.group(1)) <= 0:
        raise DvfsError(f"--max-lease {text!r} is not a duration: write e.g. 24h, 90m, 30s or 2d")
    return float(m.group(1)) * _UNITS_S[m.group(2)]


@dataclasses.dataclass(frozen=True)
class ClockdOptions:
    """The options of `dvfs-mlops clockd`.

    Attributes:
        socket: the socket (None: $DVFS_CLOCKD_SOCKET, else /run/dvfs-mlops/clockd.sock).
        group: the group the service serves.
        unit_dir: where `install` writes the systemd unit (tests and unusual systems).
        max_lease_s: serve, install: the longest one pin may last, renewals included.
        device: release: the device key whose pin root ends (as `status` names it).
    """

    socket: Path | None = None
    group: str = DEFAULT_GROUP
    unit_dir: Path = UNIT_DIR
    max_lease_s: float = 24 * 3600.0
    device: str = ""

    @classmethod
    def from_cli(cls, device: str, socket: str, group: str, unit_dir: str, max_lease: str) -> ClockdOptions:
        """The record from the command line's text (an empty string: the default).

        Raises:
            DvfsError: --max-lease is not a duration.
        """
        return cls(Path(socket) if socket else None, group, Path(unit_dir) if unit_dir else UNIT_DIR,
                   parse_duration(max_lease), device)

    @property
    def socket_path(self) -> Path:
        return self.socket or settings.clockd_socket()


# -- what the unit runs as root must be root's alone ------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Installation:
    """What the unit would run as root: the interpreter, the package, where Python finds packages, the script.

    Attributes:
        interpreter: the interpreter `install` runs from (a venv's bin/python link is kept as is: its venv matters).
        package: the dvfs_mlops package folder (an editable install's checkout).
        site_packages: the folders Python imports from at start-up (their .pth files run as the interpreter starts).
        script: the dvfs-mlops script beside the interpreter, where there is one.
    """

    interpreter: Path
    package: Path
    site_packages: tuple[Path, ...]
    script: Path | None = None

    @classmethod
    def current(cls) -> Installation:
        """This process's installation."""
        import dvfs_mlops

        paths = sysconfig.get_paths()
        script = Path(sys.executable).parent / "dvfs-mlops"
        return cls(Path(sys.executable), Path(dvfs_mlops.__file__).parent,
                   tuple(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib"))), script if script.exists() else None)

    def files(self) -> list[Path]:
        """Every file and folder whose owner and mode decide what runs as root."""
        found = [self.interpreter, self.package, *self.site_packages, *([self.script] if self.script else [])]
        found += sorted(p for p in self.package.rglob("*") if p.suffix in ("", ".py", ".pyc", ".yaml", ".json"))
        for folder in self.site_packages:
            found += sorted(folder.glob("*.pth"))
        return found


def _unsafe(path: Path, above: bool) -> str:
    try:
        st = path.lstat()
    except OSError as e:
        return f"{path} ({e.strerror})"
    if st.st_uid != 0:
        return f"{path} (owner uid {st.st_uid})"
    sticky = above and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX  # /tmp: nobody renames root's entries
    if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o022 and not sticky:
        return f"{path} (mode {stat.S_IMODE(st.st_mode):04o})"
    return ""


def installation_problems(inst: Installation) -> list[str]:
    """The files and folders of `inst` (and every folder above each, and what each link points to) that someone other
    than root could change: each one unless root owns it and neither its group nor others may write it (a folder above
    may be a sticky one of root's, as /tmp, where nobody can rename or remove root's entries)."""
    seen: dict[Path, str] = {}
    for path in inst.files():
        for p in (path, Path(os.path.realpath(path))):
            for i, q in enumerate([p, *p.parents]):
                if q not in seen:
                    seen[q] = _unsafe(q, above=i > 0)
    return [why for why in seen.values() if why]


# -- the unit ---------------------------------------------------------------------------------------------------------
def _value(text: str, what: str) -> str:
    """`text` as one double-quoted word of a unit's command line (systemd.service(5), "Command lines"; systemd.unit(5),
    "Specifiers": % is written %%; $ is written $$ so nothing is substituted).

    Raises:
        DvfsError: `text` holds a control character (a newline would start another directive).
    """
    if any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise DvfsError(f"the {what} {text!r} holds a control character (a newline?): pick another")
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"'


def _executable(path: Path) -> str:
    """The program of a unit's command line: quoted as any word, but systemd takes no escape in it (it refuses " and \\
    in an executable's name, and substitutes nothing there, so $$ would stay two characters)."""
    if any(c in str(path) for c in '"\\$'):
        raise DvfsError(f"the interpreter {str(path)!r} has a \" \\ or $ in its path, which a systemd unit cannot run: "
                        f"{SYSTEM_WIDE}")
    return _value(str(path), "interpreter")


def _checked_group(group: str) -> str:
    if not _GROUP_NAME.fullmatch(group):
        raise DvfsError(f"--group {group!r} is not a group name (lower-case letters, digits, _ and -, or a number)")
    return group


def render_unit(options: ClockdOptions, interpreter: Path | None = None) -> str:
    """The systemd unit that runs the service: sandboxed (`HARDENING`), restarted on failure, its folders made by systemd.

    /run/dvfs-mlops is the unit's RuntimeDirectory (systemd.exec(5): made when the unit starts, kept across restarts
    with RuntimeDirectoryPreserve so a pin's lock file outlives a restart) and /var/lib/dvfs-mlops its StateDirectory
    (the journals, 0700); a socket in another folder gets that folder as a ReadWritePaths. No environment value is
    written into the unit: the service reads its own.

    Args:
        options: the socket, group and maximum lease.
        interpreter: the Python that runs the service (None: this one).

    Raises:
        DvfsError: a value that cannot be written into a unit (a control character, a group name that is not one).
    """
    path = options.socket_path
    group = _checked_group(options.group)
    args = ["-I", "-m", "dvfs_mlops", "clockd", "serve", "--socket", str(path), "--group", group, "--max-lease",
            f"{options.max_lease_s:g}s"]
    command = " ".join([_executable(interpreter or Path(sys.executable)), *(_value(a, "socket path") for a in args)])
    extra = "" if path.parent == Path("/run") / STATE_NAME else f"ReadWritePaths=-{_value(str(path.parent), 'socket folder')}\n"
    return ("[Unit]\n"
            f"Description=dvfs-mlops clock service: members of group {group} pin GPU clocks without root\n"
            "After=local-fs.target\n\n"
            "[Service]\n"
            "Type=simple\n"
            f"ExecStart={command}\n"
            "ExecReload=/bin/kill -HUP $MAINPID\n"
            "Restart=on-failure\n"
            "RestartSec=1\n"
            f"RuntimeDirectory={STATE_NAME}\n"
            "RuntimeDirectoryMode=0750\n"
            "RuntimeDirectoryPreserve=yes\n"
            f"StateDirectory={STATE_NAME}\n"
            "StateDirectoryMode=0700\n"
            f"{extra}"
            + "".join(f"{line}\n" for line in HARDENING) +
            "\n[Install]\n"
            "WantedBy=multi-user.target\n")


def _run(argv: list[str], say: Callable[[str], None]) -> bool:
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        say(f"{' '.join(argv)} failed: {(out.stderr or out.stdout).strip().splitlines()[-1:] or out.returncode}")
    return out.returncode == 0


SYSTEM_WIDE = ("install it system-wide as root first, e.g. `sudo python3 -m venv /opt/dvfs-mlops && sudo /opt/dvfs-mlops/bin/"
               "pip install dvfs-mlops` (or a root-owned checkout with `pip install -e`), then run `sudo /opt/dvfs-mlops/bin/"
               "dvfs-mlops clockd install`")


def install(options: ClockdOptions, say: Callable[[str], None], inst: Installation | None = None) -> list[str]:
    """Check the installation, write the config (where none exists) and the unit, create the group, add the user who ran
    sudo to it, enable the unit.

    Args:
        options: the socket, group, unit folder and maximum lease.
        say: where a failed tool's line goes.
        inst: what the unit would run (None: this process's installation).

    Returns:
        What was done, one line each.

    Raises:
        DvfsError: not root, or someone other than root could change what the unit would run (the line names the first
            such path and how to install system-wide).
    """
    _need_root("install")
    inst = inst or Installation.current()
    problems = installation_problems(inst)
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise DvfsError(f"refusing to install a root service that runs code others can change: {problems[0]}{more} is not "
                        f"root's alone; {SYSTEM_WIDE}")
    unit_text = render_unit(options, inst.interpreter)
    lines = _ensure_group(options.group, say)
    user = settings.sudo_user()
    if user and user != "root" and shutil.which("usermod") and _run(["usermod", "-aG", options.group, user], say):
        lines.append(f"added {user} to group {options.group}: log in again (or run 'newgrp {options.group}') to use it")
    lines += _write_config()
    options.unit_dir.mkdir(parents=True, exist_ok=True)
    unit = options.unit_dir / UNIT_NAME
    unit.write_text(unit_text)
    unit.chmod(0o644)
    lines.append(f"wrote {unit}")
    if shutil.which("systemctl") is None:
        lines.append(f"systemctl not found (a container?): start the service yourself: {inst.interpreter} -I -m dvfs_mlops "
                     "clockd serve")
        return lines
    if _run(["systemctl", "daemon-reload"], say) and _run(["systemctl", "enable", "--now", UNIT_NAME], say):
        lines.append(f"enabled and started {UNIT_NAME}; socket {options.socket_path}")
    return lines


def _ensure_group(group: str, say: Callable[[str], None]) -> list[str]:
    try:
        grp.getgrnam(group)
        return []
    except KeyError:
        if not shutil.which("groupadd") or not _run(["groupadd", "--system", group], say):
            raise DvfsError(f"could not create group {group!r}; create it (groupadd --system {group}) "
                            "and run install again") from None
    return [f"created group {group}"]


def _write_config() -> list[str]:
    from dvfs_mlops.hw.clockd.config import EXAMPLE_CONFIG, config_path

    path = config_path()
    if path.exists():
        return [f"kept {path}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o755)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    with os.fdopen(fd, "w") as f:
        f.write(EXAMPLE_CONFIG)
    return [f"wrote {path} (NVML GPUs: all, not assumed unlocked; edit it, then systemctl reload {UNIT_NAME})"]


def uninstall(options: ClockdOptions, say: Callable[[str], None]) -> list[str]:
    """Stop and disable the unit, remove its file (the group and the config stay: they may have other uses).

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


def _ask(options: ClockdOptions, op: str, device: str = "") -> Reply:
    from dvfs_mlops.hw.clockd.client import ClockdClient
    from dvfs_mlops.hw.clockd.protocol import Request

    client = ClockdClient(options.socket_path)
    try:
        return client.request(Request(op, device=device)).raise_for_error()
    finally:
        client.close()


def status(options: ClockdOptions) -> list[str]:
    """The service (systemd's view where there is one), its socket, its limits and NVML scope, and every pin it holds:
    who (uid, the PID that renews it and whether it is alive), since when, how much lease is left."""
    from dvfs_mlops.hw.clockd.protocol import group_name

    lines = []
    if shutil.which("systemctl") is not None:
        out = subprocess.run(["systemctl", "is-active", UNIT_NAME], capture_output=True, text=True, check=False)
        lines.append(f"service:  {UNIT_NAME} {out.stdout.strip() or 'unknown'}")
    path = options.socket_path
    try:
        st = os.stat(path)
    except OSError:
        return [*lines, f"socket:   {path} missing: no service (sudo dvfs-mlops clockd install)"]
    lines.append(f"socket:   {path} (group {group_name(st.st_gid)}, mode {stat.S_IMODE(st.st_mode):04o})")
    reply = _ask(options, "status")
    lines += [f"scope:    {reply.scope}", *(f"service:  {x}" for x in reply.lines)]
    return lines + ([f"pinned:   {p.line()}" for p in reply.pins] or ["pinned:   none"])


def release(options: ClockdOptions) -> list[str]:
    """Root ends a member's pin: the service restores it, and the holder's next call is told in one line.

    Raises:
        DvfsError: no DEVICE named, not root (the service refuses), or nothing pinned there (the line lists what is).
    """
    if not options.device:
        raise DvfsError("name the device to release, as `dvfs-mlops clockd status` shows it (e.g. jetson-17000000.gpu)")
    return _ask(options, "release", options.device).lines


def _need_root(what: str) -> None:
    if os.geteuid() != 0:
        raise DvfsError(f"clockd {what} writes a systemd unit and a group: run it once as root (sudo dvfs-mlops clockd {what})")


def serve(options: ClockdOptions) -> None:
    """Run the service in the foreground, as root, logging who pinned what to stderr (journald under systemd)."""
    from dvfs_mlops.hw.clockd.config import ServiceConfig
    from dvfs_mlops.hw.clockd.server import serve as run_service

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    run_service(ServiceConfig(options.socket_path, options.group, max_lease_s=options.max_lease_s))


def clockd_command(action: str, options: ClockdOptions, say: Callable[[str], None]) -> list[str]:
    """`dvfs-mlops clockd ACTION`: serve (foreground, until stopped), install, uninstall, status or release.

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
    if action == "release":
        return release(options)
    return status(options)
