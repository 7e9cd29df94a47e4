"""A fake Jetson AGX Orin sysfs tree that behaves like the kernel, served over FUSE.

`mount_orin()` builds a plain tree with testkit/fakes/sysfs.py `make_orin_tree()` (the backing dir) and
serves it at a mount point from a FUSE daemon in a child process. Everything is passed through to the
backing dir (symlinks included, so os.path.realpath works through the relative links), except:

* the GPU devfreq node, which follows drivers/devfreq/devfreq.c (torvalds/linux):
  - min_freq / max_freq take a decimal integer, parsed as the kernel's sscanf("%lu") does (leading
    digits; anything else EINVAL). What is written is the user's request, stored as written (the backing
    file holds it): min_freq_store/max_freq_store turn it into a PM QoS request in kHz (min rounded down,
    max rounded up, DIV_ROUND_UP; 0 for max_freq means "no limit").
  - reads never show the request: min_freq_show/max_freq_show print get_freq_range(), the table's
    [min, max] narrowed by every PM QoS request on the device (the user's, and a thermal cap: nvgpu
    registers the GPU's devfreq as a cooling device, and drivers/thermal/devfreq_cooling.c,
    devfreq_cooling_set_cur_state, caps it with dev_pm_qos_update_request(&dfc->req_max_freq, ...)),
    and "if (*min_freq > *max_freq) *min_freq = *max_freq". So a read taken under a thermal cap returns
    the cap, never what the user wrote.
  - rule "einval" (default; min_freq_store/max_freq_store before the PM QoS conversion of Linux 5.7:
    `if (value && max && value > max) return -EINVAL`, against the user's own values): a write that would
    leave the user's min above the user's max fails with EINVAL and changes nothing.
    rule "qos" (mainline >= 5.7, which JetPack 5's 5.10 and JetPack 6's 5.15 kernels are based on):
    the write is accepted and min_freq reads as max_freq ("max_freq takes precedence over min_freq").
  - cur_freq is computed on each read: the governor's target under load, the top of get_freq_range(),
    rounded down to a table entry (the clock the GPU can run at).
  - nvpmodel has no cap of its own: `set_nvpmodel_mode` does what `nvpmodel -m` does, it writes the mode's
    GPU MIN_FREQ/MAX_FREQ into the same min_freq/max_freq requests (testkit/fakes/sysfs.py,
    `apply_nvpmodel_mode`, after NVIDIA's nvpmodel template).
  - governor takes only a name listed in available_governors (EINVAL otherwise).
  - cur_freq, available_frequencies and available_governors are 0444 with no store: opening them for
    writing fails with EACCES (kernfs does this even for root).
  - truncation (open with O_TRUNC) is ignored, and each write(2) is one store, at any offset.
* rail reads (in{N}_input / curr{N}_input under hwmon) can be made to fail with EIO.
* BPMP's GPC clock counters (sys/kernel/debug/bpmp/debug/clk/nafll_gpc{N}/pto_counter, where the backing tree has
  them: testkit/fakes/sysfs.py `set_gpc_clock_hz`) read as the clock the GPU runs at, cur_freq's value: jetson-stats
  shows them as the GPU's measured clock (rbonghi/jetson_stats jtop/core/gpu.py @f41d5ca, l.120-129).
* each cpufreq policy (sys/devices/system/cpu/cpufreq/policyN), after drivers/cpufreq/cpufreq.c: scaling_min_freq /
  scaling_max_freq take what sscanf("%lu") parses (EINVAL otherwise) as the user's frequency QoS request (the backing
  file holds it) and are never refused for min > max; reads show policy->min/max (testkit/fakes/sysfs.py
  `cpufreq_policy_range`: the requests aggregated with a CPU cooling device's cap, within cpuinfo, min never above
  max, resolved to the table); scaling_cur_freq and cpuinfo_cur_freq (0400) read the top of that range; the other
  attributes have no store (EACCES on open for writing); scaling_governor takes a listed governor.
* BPMP's EMC clock (sys/kernel/debug/bpmp/debug/clk/emc): mrq_rate_locked takes 0 or 1; rate takes a rate in Hz
  (`bpmp_round_hz`); rate reads `emc_rate_shown`: the rate written while locked, else the kernel's (the backing `rate`
  file: `set_emc_kernel_rate_hz`); min_rate, max_rate and BPMP's possible_rates have no store.

Every read goes to the daemon (`direct_io`, zero attribute/entry timeouts): os.pread on a file held
open returns the current value each time, as sysfs does.

The daemon is a child process (`python -m testkit.fakes.kernelfs`); knobs go over a socketpair (a
multiprocessing Connection) to a control thread in it: see `KernelTree`.

mfusepy is imported only inside functions: it loads libfuse at import and raises OSError where
libfuse is missing, which at module level would break test collection.
"""
from __future__ import annotations

import atexit
import contextlib
import errno
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from testkit.fakes.sysfs import (
    CPUFREQ_DIR,
    CPUFREQ_READ_ONLY_ATTRS,
    CPUFREQ_STORE_ATTRS,
    EMC_CLK_DIR,
    EMC_POSSIBLE_RATES,
    EMC_READ_ONLY_ATTRS,
    EMC_STORE_ATTRS,
    FakeJetson,
    apply_nvpmodel_mode,
    bpmp_round_hz,
    cpufreq_policy_range,
    emc_rate_shown,
    make_orin_tree,
)

MOUNT_TIMEOUT_S = 10.0
CONTROL_TIMEOUT_S = 5.0
UNMOUNT_TIMEOUT_S = 5.0

RULES = ("einval", "qos")
_RAIL_RE = re.compile(r"^(in|curr)\d+_input$")
_READ_ONLY_ATTRS = ("cur_freq", "available_frequencies", "available_governors")
_GPC_RE = re.compile(r"^sys/kernel/debug/bpmp/debug/clk/nafll_gpc\d+/pto_counter$")
_STORE_ATTRS = ("min_freq", "max_freq", "governor")
_REPO = Path(__file__).resolve().parents[2]
_LIVE: set[KernelTree] = set()
_available: tuple[bool, str] | None = None


# -- is FUSE usable here? ----------------------------------------------------------------------------
def fuse_available() -> tuple[bool, str]:
    """(True, "") where a kernel tree can be mounted; else (False, why). Cached per process."""
    global _available
    if _available is None:
        _available = _probe()
    return _available


def _probe() -> tuple[bool, str]:
    if not os.path.exists("/dev/fuse"):
        return False, "no /dev/fuse (FUSE is not available in this kernel or container)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return False, f"cannot open /dev/fuse: {e.strerror}"
    if shutil.which("fusermount3") is None:
        return False, "no fusermount3 (apt-get install fuse3)"
    try:
        import mfusepy  # noqa: F401
    except ImportError:
        return False, "mfusepy is not installed (pip install mfusepy)"
    except OSError as e:  # mfusepy loads libfuse at import
        return False, f"libfuse3 cannot be loaded: {e} (apt-get install libfuse3-3)"
    tmp = Path(tempfile.mkdtemp(prefix="kernelfs-probe-"))
    try:
        with mount_orin(tmp):
            pass
    except Exception as e:  # noqa: BLE001 - any failure is the reason FUSE tests skip
        return False, f"mount failed: {e}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return True, ""


# -- the parent side ---------------------------------------------------------------------------------
class WriteLog(list):
    """The daemon's write log, as [(name, value, errno)] with errno 0 for an accepted write.

    A snapshot: `clear()` also clears the daemon's log.
    """

    def __init__(self, items: list, tree: KernelTree):
        super().__init__(items)
        self._tree = tree

    def clear(self) -> None:  # type: ignore[override]
        super().clear()
        self._tree.clear_log()


class KernelTree:
    """A mounted fake Orin: FakeJetson's API (root, node, hwmon, read, range_hz, set_rail) on the mount,
    plus the kernel's knobs. `backing` is the plain tree behind it (writes there bypass the rules).

    Knobs (each a round trip to the daemon):
      set_throttle_cap_hz(hz | None)   thermal cap: a PM QoS max request beside the user's (set_cap_hz: the same)
      set_cpu_cap_khz(policy, khz)     a CPU cooling device's max request on one policy (None: none)
      set_emc_kernel_rate_hz(hz)       the EMC rate the kernel asks BPMP for (read while mrq_rate_locked is 0)
      set_emc_floor_hz(hz)             BPMP's EMC min_rate (a floor it holds)
      set_nvpmodel_mode(mode_id)       what `nvpmodel -m` leaves: its status file and the mode's GPU and CPU ranges
                                       as the user's requests, its EMC cap in emc_iso_cap
      read_only = True                 every open-for-write in the devfreq node fails EACCES
      fail_writes = {"min_freq"}       writes of these devfreq files fail EIO (set() clears)
      fail_rail_reads(n)               the next n reads at offset 0 of rail inputs fail EIO
      rule = "einval" | "qos"          what a min > max write does (see the module doc)
      log / writes / clear_log()       every write to a clock's file (cpufreq as "policyN/NAME", EMC as "emc/NAME");
                                       accepted devfreq min/max writes
      reset()                          all knobs off, log empty (the files keep their values)
    """

    def __init__(self, backing: FakeJetson, mountpoint: Path, rule: str = "einval"):
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}")
        self.backing = backing
        self.mountpoint = Path(mountpoint)
        self.root = self.mountpoint
        self.node = self.mountpoint / backing.node.relative_to(backing.root)
        self.hwmon = [self.mountpoint / h.relative_to(backing.root) for h in backing.hwmon]
        self._rule = rule
        self._proc: Any = None
        self._conn: Any = None
        self._lock = threading.Lock()

    # FakeJetson's API ---------------------------------------------------------------------------
    def read(self, name: str) -> str:
        return (self.node / name).read_text().strip()

    @property
    def range_hz(self) -> tuple[int, int]:
        return int(self.read("min_freq")), int(self.read("max_freq"))

    def set_rail(self, label: str, mv: int, ma: int) -> None:
        self.backing.set_rail(label, mv, ma)

    @staticmethod
    def write(path: Path, value: str) -> None:
        """A plain single write(2), like the backend's: JetsonDevice(writer=tree.write) works too."""
        with open(path, "w") as f:
            f.write(value)

    # knobs ---------------------------------------------------------------------------------------
    def _call(self, *msg: Any) -> Any:
        with self._lock:
            if self._conn is None:
                raise RuntimeError("the kernel tree is not mounted")
            self._conn.send(msg)
            if not self._conn.poll(CONTROL_TIMEOUT_S):
                raise TimeoutError(f"the kernelfs daemon did not answer {msg[0]!r} within {CONTROL_TIMEOUT_S} s")
            ok, value = self._conn.recv()
        if not ok:
            raise RuntimeError(f"kernelfs daemon: {value}")
        return value

    def _set(self, **knobs: Any) -> None:
        self._call("set", knobs)

    def state(self) -> dict[str, Any]:
        return self._call("state")

    def set_throttle_cap_hz(self, hz: int | None) -> None:
        self._set(throttle_cap=hz)

    set_cap_hz = set_throttle_cap_hz  # FakeKernel's name

    def set_cpu_cap_khz(self, policy: str, khz: int | None) -> None:
        caps = dict(self.state()["cpu_caps"])
        if khz is None:
            caps.pop(policy, None)
        else:
            caps[policy] = int(khz)
        self._set(cpu_caps=caps)

    def set_emc_kernel_rate_hz(self, hz: int) -> None:
        (self.backing.emc / "rate").write_text(f"{hz}\n")

    def set_emc_floor_hz(self, hz: int) -> None:
        (self.backing.emc / "min_rate").write_text(f"{hz}\n")

    # the CPU policies and the EMC clock, read through the mount --------------------------------------------------------
    def policy(self, name: str) -> Path:
        return self.mountpoint / self.backing.policy(name).relative_to(self.backing.root)

    def cpu_range_khz(self, name: str) -> tuple[int, int]:
        pol = self.policy(name)
        return int((pol / "scaling_min_freq").read_text()), int((pol / "scaling_max_freq").read_text())

    @property
    def emc(self) -> Path:
        return self.mountpoint / EMC_CLK_DIR

    def emc_state(self) -> tuple[int, int]:
        return int((self.emc / "mrq_rate_locked").read_text()), int((self.emc / "rate").read_text())

    def set_nvpmodel_mode(self, mode_id: int) -> None:
        """`nvpmodel -m MODE_ID` as root: the backing files hold the user's requests, so nvpmodel's writes land there."""
        with self._lock:
            apply_nvpmodel_mode(self.backing, mode_id)

    @property
    def read_only(self) -> bool:
        return bool(self.state()["read_only"])

    @read_only.setter
    def read_only(self, value: bool) -> None:
        self._set(read_only=bool(value))

    @property
    def fail_writes(self) -> set[str]:
        return set(self.state()["fail_writes"])

    @fail_writes.setter
    def fail_writes(self, names: set[str] | list[str] | tuple[str, ...]) -> None:
        self._set(fail_writes=sorted(names))

    def fail_rail_reads(self, n: int) -> None:
        self._set(rail_eio=int(n))

    @property
    def rule(self) -> str:
        return self.state()["rule"]

    @rule.setter
    def rule(self, value: str) -> None:
        if value not in RULES:
            raise ValueError(f"rule must be one of {RULES}")
        self._set(rule=value)

    @property
    def log(self) -> WriteLog:
        return WriteLog([tuple(e) for e in self._call("log")], self)

    @property
    def writes(self) -> list[tuple[str, int]]:
        """Accepted min/max writes, as (name, Hz)."""
        return [(n, int(v)) for n, v, err in self.log if err == 0 and n in ("min_freq", "max_freq")]

    def clear_log(self) -> None:
        self._call("clear_log")

    def reset(self) -> None:
        self._call("reset")

    # lifecycle -----------------------------------------------------------------------------------
    def mount(self) -> KernelTree:
        """Start the daemon (`python -m testkit.fakes.kernelfs`, so nothing depends on the test process's
        __main__ or threads) and wait, at most MOUNT_TIMEOUT_S, until it serves the mount point."""
        from multiprocessing.connection import Connection

        self.mountpoint.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair()
        args = [sys.executable, "-m", "testkit.fakes.kernelfs", str(theirs.fileno()), str(self.backing.root),
                str(self.mountpoint), str(self.backing.node.relative_to(self.backing.root)), self._rule,
                *(str(h.relative_to(self.backing.root)) for h in self.backing.hwmon)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(_REPO), os.environ.get("PYTHONPATH", "")) if p)}
        try:
            self._proc = subprocess.Popen(args, pass_fds=[theirs.fileno()], env=env, cwd=_REPO, stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        self._conn = Connection(ours.detach())
        _LIVE.add(self)
        try:
            deadline = time.monotonic() + MOUNT_TIMEOUT_S
            while not _is_mounted(self.mountpoint):
                if self._proc.poll() is not None:
                    why = _last_error(self._conn) if self._conn.poll(0) else ""
                    raise RuntimeError(f"the FUSE daemon exited with {self._proc.returncode} before mounting "
                                       f"{self.mountpoint}{': ' + why if why else ''}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{self.mountpoint} was not mounted within {MOUNT_TIMEOUT_S} s")
                time.sleep(0.002)
            self._call("ping")
        except BaseException:
            self.unmount()
            raise
        return self

    def unmount(self) -> None:
        """fusermount3 -u (lazy -uz where busy), then end the daemon; every wait has a timeout."""
        _LIVE.discard(self)
        wait_s = UNMOUNT_TIMEOUT_S
        try:
            if _is_mounted(self.mountpoint):
                r = _fusermount("-u", self.mountpoint)
                if r != 0 and _is_mounted(self.mountpoint):
                    # Busy (a file is still open): detach it; the daemon would serve the open files until they
                    # are closed, so it is killed shortly, and those files then fail with ENOTCONN.
                    _fusermount("-uz", self.mountpoint)
                    wait_s = 0.2
        finally:
            proc, self._proc = self._proc, None
            if proc is not None:
                try:
                    proc.wait(wait_s)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(UNMOUNT_TIMEOUT_S)
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    @property
    def mounted(self) -> bool:
        return _is_mounted(self.mountpoint)

    def __enter__(self) -> KernelTree:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.unmount()


def mount_orin(tmp: Path, jetpack: int = 6, nvpmodel_mode: int = 0, rule: str = "einval", module: str = "p3701-0005") -> KernelTree:
    """Build a fake Orin (`module`: its P-number, testkit/fakes/sysfs.py ORIN_MODULES) under tmp/backing and serve it
    at tmp/mnt. Use as a context manager, or call unmount() (an atexit hook unmounts whatever is left)."""
    backing = make_orin_tree(Path(tmp) / "backing", jetpack=jetpack, nvpmodel_mode=nvpmodel_mode, module=module)
    return KernelTree(backing, Path(tmp) / "mnt", rule=rule).mount()


def _last_error(conn: Any) -> str:
    with contextlib.suppress(Exception):
        return str(conn.recv()[1])
    return ""


def _unescape_mount(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _is_mounted(path: Path) -> bool:
    """From /proc/self/mounts: never touches the mount itself (a dead daemon cannot hang it)."""
    target = os.path.abspath(path)
    try:
        with open("/proc/self/mounts") as f:
            return any(_unescape_mount(line.split()[1]) == target for line in f if len(line.split()) > 1)
    except OSError:
        return False


def _fusermount(flag: str, path: Path) -> int:
    try:
        return subprocess.run(["fusermount3", flag, str(path)], capture_output=True, timeout=UNMOUNT_TIMEOUT_S).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


@atexit.register
def _unmount_all() -> None:
    for tree in list(_LIVE):
        with contextlib.suppress(Exception):
            tree.unmount()


# -- the daemon (child process) ----------------------------------------------------------------------
def _parse_int(text: str) -> int | None:
    """sscanf(buf, "%lu"): leading blanks, then decimal digits; whatever follows them is ignored."""
    m = re.match(r"\s*\+?(\d+)", text)
    return int(m.group(1)) if m else None


class _State:
    def __init__(self, rule: str):
        self.lock = threading.Lock()
        self.rule = rule
        self.reset()

    def reset(self) -> None:
        self.read_only = False
        self.fail_writes: set[str] = set()
        self.rail_eio = 0
        self.throttle_cap: int | None = None
        self.cpu_caps: dict[str, int] = {}
        self.emc_debug_hz: int | None = None  # the rate written to BPMP's debugfs (shown while locked)
        self.log: list[tuple[str, str, int]] = []

    def snapshot(self) -> dict[str, Any]:
        return {"rule": self.rule, "read_only": self.read_only, "fail_writes": sorted(self.fail_writes),
                "rail_eio": self.rail_eio, "throttle_cap": self.throttle_cap, "cpu_caps": dict(self.cpu_caps),
                "emc_debug_hz": self.emc_debug_hz}


def _control(conn: Any, state: _State, mountpoint: str) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the test process is gone: do not leave a mount behind
            _fusermount("-uz", Path(mountpoint))
            os._exit(0)
        try:
            with state.lock:
                cmd = msg[0]
                if cmd == "ping":
                    reply: Any = "pong"
                elif cmd == "state":
                    reply = state.snapshot()
                elif cmd == "log":
                    reply = list(state.log)
                elif cmd == "clear_log":
                    state.log.clear()
                    reply = None
                elif cmd == "reset":
                    state.reset()
                    reply = None
                elif cmd == "set":
                    for key, value in msg[1].items():
                        if key == "fail_writes":
                            value = set(value)
                        if key == "rule" and value not in RULES:
                            raise ValueError(f"unknown rule {value!r}")
                        if not hasattr(state, key) or key in ("lock", "log"):
                            raise KeyError(key)
                        setattr(state, key, value)
                    reply = None
                else:
                    raise KeyError(cmd)
            conn.send((True, reply))
        except Exception as e:  # noqa: BLE001 - the answer carries the error
            conn.send((False, f"{type(e).__name__}: {e}"))


def _serve(backing: str, mountpoint: str, node_rel: str, hw_rel: list[str], rule: str, conn: Any) -> None:
    try:
        import mfusepy
    except (ImportError, OSError) as e:
        conn.send((False, f"cannot import mfusepy: {e}"))
        raise SystemExit(3) from None
    logging.getLogger("mfusepy").setLevel(logging.CRITICAL)  # refused writes are the point, not news
    state = _State(rule)
    threading.Thread(target=_control, args=(conn, state, mountpoint), daemon=True, name="kernelfs-control").start()
    ops = _make_ops(mfusepy, backing, node_rel, hw_rel, state)
    try:
        mfusepy.FUSE(ops, mountpoint, foreground=True, nothreads=True, fsname="kernelfs", subtype="kernelfs")
    except Exception as e:  # noqa: BLE001 - tell the parent why
        with contextlib.suppress(Exception):
            conn.send((False, f"FUSE: {e}"))
        raise SystemExit(4) from None


def _make_ops(mfusepy: Any, backing: str, node_rel: str, hw_rel: list[str], state: _State) -> Any:
    FuseOSError = mfusepy.FuseOSError
    node_rel = node_rel.strip("/")
    hw_dirs = {h.strip("/") for h in hw_rel}
    policy_dirs = {str(pol.relative_to(backing)) for pol in Path(backing, CPUFREQ_DIR).glob("policy*")}

    def fail(err: int) -> None:
        raise FuseOSError(err)

    class KernelOps(mfusepy.Operations):
        use_ns = True

        def _full(self, path: str) -> str:
            return os.path.join(backing, path.lstrip("/"))

        @staticmethod
        def _node_attr(path: str) -> str | None:
            """The name of a devfreq attribute of the GPU node (None for any other path)."""
            rel = path.strip("/")
            head, _, name = rel.rpartition("/")
            return name if head == node_rel and name in _STORE_ATTRS + _READ_ONLY_ATTRS else None

        @staticmethod
        def _clock_attr(path: str) -> tuple[str, str, str] | None:
            """(kind, folder, name) of a cpufreq policy's attribute ("cpufreq") or of BPMP's EMC files ("emc"); None
            for any other path. The write log names them "policyN/NAME" and "emc/NAME"."""
            rel = path.strip("/")
            head, _, name = rel.rpartition("/")
            if head in policy_dirs and name in CPUFREQ_STORE_ATTRS + CPUFREQ_READ_ONLY_ATTRS:
                return "cpufreq", head, name
            if (head == EMC_CLK_DIR and name in EMC_STORE_ATTRS + EMC_READ_ONLY_ATTRS) or rel == EMC_POSSIBLE_RATES:
                return "emc", head, name
            return None

        @staticmethod
        def _log_name(attr: tuple[str, str, str]) -> str:
            kind, head, name = attr
            return f"{head.rpartition('/')[2]}/{name}" if kind == "cpufreq" else f"emc/{name}"

        @staticmethod
        def _writable(attr: tuple[str, str, str]) -> bool:
            kind, _head, name = attr
            return name in (CPUFREQ_STORE_ATTRS if kind == "cpufreq" else EMC_STORE_ATTRS)

        @staticmethod
        def _is_gpc(path: str) -> bool:
            """One of BPMP's GPC clock counters (debugfs)."""
            return bool(_GPC_RE.match(path.strip("/")))

        @staticmethod
        def _is_rail(path: str) -> bool:
            head, _, name = path.strip("/").rpartition("/")
            return head in hw_dirs and bool(_RAIL_RE.match(name))

        def init_with_config(self, conn_info: Any, config: Any) -> None:
            if config is not None:  # sysfs: nothing cached, every read and lookup reaches us
                config.direct_io = 1
                config.kernel_cache = 0
                config.auto_cache = 0
                config.entry_timeout = 0.0
                config.negative_timeout = 0.0
                config.attr_timeout = 0.0
                config.hard_remove = 1

        # the devfreq node ---------------------------------------------------------------------
        def _read_file(self, name: str) -> str:
            with open(os.path.join(backing, node_rel, name)) as f:
                return f.read()

        def _table(self) -> list[int]:
            return sorted(int(x) for x in self._read_file("available_frequencies").split())

        def _requests(self) -> tuple[int, int]:
            """The user's requests as PM QoS holds them (Hz): min rounded down to kHz, max rounded up (0: no limit)."""
            raw_min = _parse_int(self._read_file("min_freq")) or 0
            raw_max = _parse_int(self._read_file("max_freq")) or 0
            return raw_min // 1000 * 1000, -(-raw_max // 1000) * 1000

        def _range(self) -> tuple[int, int]:
            """get_freq_range(): the table's range narrowed by every QoS request (the user's, the thermal cap)."""
            table = self._table()
            qos_min, qos_max = self._requests()
            hi = min(table[-1], qos_max or table[-1], table[-1] if state.throttle_cap is None else state.throttle_cap)
            lo = max(table[0], qos_min)
            return min(lo, hi), hi

        def _cur(self) -> int:
            table = self._table()
            _lo, hi = self._range()  # the governor's target under load: the top of the range
            below = [t for t in table if t <= hi]
            return below[-1] if below else table[0]

        def _show(self, name: str) -> bytes:
            if name == "min_freq":
                text = f"{self._range()[0]}\n"
            elif name == "max_freq":
                text = f"{self._range()[1]}\n"
            elif name == "cur_freq":
                text = f"{self._cur()}\n"
            else:
                text = self._read_file(name)
            return text.encode()

        def _store(self, name: str, data: bytes) -> int:
            value = data.decode(errors="replace").strip()

            def refuse(err: int) -> None:
                state.log.append((name, value, err))
                fail(err)

            if state.read_only:
                refuse(errno.EACCES)
            if name in state.fail_writes:
                refuse(errno.EIO)
            if name in ("min_freq", "max_freq"):
                hz = _parse_int(value)
                if hz is None:
                    refuse(errno.EINVAL)
                user_min, user_max = self._requests()
                if state.rule == "einval":  # against the user's own other limit, as min_freq_store did before 5.7
                    if name == "min_freq" and hz and user_max and hz > user_max:
                        refuse(errno.EINVAL)
                    if name == "max_freq" and hz and hz < user_min:
                        refuse(errno.EINVAL)
                stored = str(hz)
            elif name == "governor":
                if value not in self._read_file("available_governors").split():
                    refuse(errno.EINVAL)
                stored = value
            else:
                refuse(errno.EACCES)
            with open(os.path.join(backing, node_rel, name), "w") as f:
                f.write(stored + "\n")
            state.log.append((name, value, 0))
            return len(data)

        # the cpufreq policies and BPMP's EMC clock --------------------------------------------
        @staticmethod
        def _backing_int(head: str, name: str) -> int:
            with open(os.path.join(backing, head, name)) as f:
                return _parse_int(f.read()) or 0

        def _cpu_range(self, head: str) -> tuple[int, int]:
            with open(os.path.join(backing, head, "scaling_available_frequencies")) as f:
                table = sorted(int(x) for x in f.read().split())
            info = (self._backing_int(head, "cpuinfo_min_freq"), self._backing_int(head, "cpuinfo_max_freq"))
            caps = [state.cpu_caps[head.rpartition("/")[2]]] if head.rpartition("/")[2] in state.cpu_caps else []
            return cpufreq_policy_range(table, info, [self._backing_int(head, "scaling_min_freq")],
                                        [self._backing_int(head, "scaling_max_freq"), *caps])

        def _clock_show(self, attr: tuple[str, str, str]) -> bytes:
            kind, head, name = attr
            if kind == "cpufreq" and name in ("scaling_min_freq", "scaling_max_freq", "scaling_cur_freq", "cpuinfo_cur_freq"):
                lo, hi = self._cpu_range(head)
                return f"{lo if name == 'scaling_min_freq' else hi}\n".encode()
            if kind == "emc" and name == "rate":
                locked = self._backing_int(head, "mrq_rate_locked") == 1
                return f"{emc_rate_shown(locked, state.emc_debug_hz, self._backing_int(head, 'rate'))}\n".encode()
            with open(os.path.join(backing, head, name), "rb") as f:
                return f.read()

        def _clock_store(self, attr: tuple[str, str, str], data: bytes) -> int:
            kind, head, name = attr
            value = data.decode(errors="replace").strip()
            logged = self._log_name(attr)

            def refuse(err: int) -> None:
                state.log.append((logged, value, err))
                fail(err)

            if state.read_only:
                refuse(errno.EACCES)
            if name in state.fail_writes or logged in state.fail_writes:
                refuse(errno.EIO)
            number = _parse_int(value)
            if kind == "cpufreq" and name == "scaling_governor":
                with open(os.path.join(backing, head, "scaling_available_governors")) as f:
                    if value not in f.read().split():
                        refuse(errno.EINVAL)
                stored = value
            elif number is None or (name == "mrq_rate_locked" and number not in (0, 1)):
                refuse(errno.EINVAL)
            elif kind == "emc" and name == "rate":
                with open(os.path.join(backing, EMC_POSSIBLE_RATES)) as f:
                    table = [int(x) * 1000 for x in f.read().split() if x.isdigit()]
                state.emc_debug_hz = bpmp_round_hz(number, table, self._backing_int(head, "min_rate"),
                                                   self._backing_int(head, "max_rate"))
                state.log.append((logged, value, 0))
                return len(data)  # BPMP keeps it; the backing `rate` stays the kernel's
            else:
                stored = str(number)
            with open(os.path.join(backing, head, name), "w") as f:
                f.write(stored + "\n")
            state.log.append((logged, value, 0))
            return len(data)

        # passthrough (and the node's rules) ---------------------------------------------------
        def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
            try:
                st = os.lstat(self._full(path))
            except OSError as e:
                raise FuseOSError(e.errno) from None
            attrs = {k: getattr(st, k) for k in ("st_mode", "st_nlink", "st_uid", "st_gid", "st_size",
                                                 "st_atime_ns", "st_mtime_ns", "st_ctime_ns")}
            attrs["st_atime"], attrs["st_mtime"], attrs["st_ctime"] = st.st_atime_ns, st.st_mtime_ns, st.st_ctime_ns
            del attrs["st_atime_ns"], attrs["st_mtime_ns"], attrs["st_ctime_ns"]
            name = self._node_attr(path)
            if name is not None and stat.S_ISREG(st.st_mode):
                attrs["st_size"] = 4096  # sysfs attributes report a page
                attrs["st_mode"] = stat.S_IFREG | (0o444 if name in _READ_ONLY_ATTRS else 0o644)
            elif self._is_gpc(path) and stat.S_ISREG(st.st_mode):
                attrs["st_size"] = 4096  # generated on each read
            clock = self._clock_attr(path)
            if clock is not None and stat.S_ISREG(st.st_mode):
                attrs["st_size"] = 4096
                mode = 0o644 if self._writable(clock) else 0o400 if clock[2] == "cpuinfo_cur_freq" else 0o444
                attrs["st_mode"] = stat.S_IFREG | mode
            return attrs

        def readdir(self, path: str, fh: Any) -> list[str]:
            try:
                return [".", "..", *os.listdir(self._full(path))]
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def readlink(self, path: str) -> str:
            try:
                return os.readlink(self._full(path))
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def access(self, path: str, amode: int) -> int:
            if not os.path.lexists(self._full(path)):
                fail(errno.ENOENT)
            return 0

        def open(self, path: str, flags: int) -> int:
            name = self._node_attr(path)
            writing = (flags & os.O_ACCMODE) != os.O_RDONLY
            with state.lock:
                if name is not None and writing:
                    if state.read_only:
                        state.log.append((name, "", errno.EACCES))
                        fail(errno.EACCES)
                    if name in _READ_ONLY_ATTRS:
                        state.log.append((name, "", errno.EACCES))
                        fail(errno.EACCES)
                if name is not None:
                    flags &= ~(os.O_TRUNC | os.O_APPEND)
                clock = self._clock_attr(path)
                if clock is not None and writing:
                    if state.read_only or not self._writable(clock):
                        state.log.append((self._log_name(clock), "", errno.EACCES))
                        fail(errno.EACCES)
                    flags &= ~(os.O_TRUNC | os.O_APPEND)
            try:
                return os.open(self._full(path), flags)
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def create(self, path: str, mode: int, flags: int = os.O_WRONLY) -> int:
            if self._node_attr(path) is not None or self._clock_attr(path) is not None:
                fail(errno.EACCES)
            try:
                return os.open(self._full(path), flags | os.O_CREAT, mode)
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
            name = self._node_attr(path)
            with state.lock:
                if name is not None:
                    return self._show(name)[offset:offset + size]
                if self._is_gpc(path):
                    return f"{self._cur()}\n".encode()[offset:offset + size]
                clock = self._clock_attr(path)
                if clock is not None:
                    return self._clock_show(clock)[offset:offset + size]
                if offset == 0 and state.rail_eio > 0 and self._is_rail(path):
                    state.rail_eio -= 1
                    fail(errno.EIO)
            try:
                return os.pread(fh, size, offset)
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
            name = self._node_attr(path)
            if name is not None:
                with state.lock:
                    return self._store(name, data)
            clock = self._clock_attr(path)
            if clock is not None:
                with state.lock:
                    return self._clock_store(clock, data)
            try:
                return os.pwrite(fh, data, offset)
            except OSError as e:
                raise FuseOSError(e.errno) from None

        def truncate(self, path: str, length: int, fh: Any = None) -> int:
            if self._node_attr(path) is not None or self._clock_attr(path) is not None:
                with state.lock:
                    if state.read_only:
                        fail(errno.EACCES)
                return 0  # sysfs ignores truncation
            try:
                os.truncate(self._full(path), length)
            except OSError as e:
                raise FuseOSError(e.errno) from None
            return 0

        def flush(self, path: str, fh: int) -> int:
            return 0

        def fsync(self, path: str, datasync: int, fh: int) -> int:
            return 0

        def release(self, path: str, fh: int) -> int:
            with contextlib.suppress(OSError):
                os.close(fh)
            return 0

        def _passthrough(self, fn: Any, *args: Any) -> int:
            try:
                fn(*args)
            except OSError as e:
                raise FuseOSError(e.errno) from None
            return 0

        def mkdir(self, path: str, mode: int) -> int:
            return self._passthrough(os.mkdir, self._full(path), mode)

        def rmdir(self, path: str) -> int:
            return self._passthrough(os.rmdir, self._full(path))

        def unlink(self, path: str) -> int:
            return self._passthrough(os.unlink, self._full(path))

        def symlink(self, target: str, source: str) -> int:
            return self._passthrough(os.symlink, source, self._full(target))

        def rename(self, old: str, new: str) -> int:
            return self._passthrough(os.rename, self._full(old), self._full(new))

        def chmod(self, path: str, mode: int) -> int:
            return self._passthrough(os.chmod, self._full(path), mode)

        def chown(self, path: str, uid: int, gid: int) -> int:
            return self._passthrough(os.lchown, self._full(path), uid, gid)

        def utimens(self, path: str, times: Any = None) -> int:
            if times is None:
                return self._passthrough(os.utime, self._full(path))
            return self._passthrough(lambda p: os.utime(p, ns=(int(times[0]), int(times[1]))), self._full(path))

        def statfs(self, path: str) -> dict[str, int]:
            st = os.statvfs(self._full(path))
            return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree",
                                                "f_files", "f_flag", "f_frsize", "f_namemax")}

    return KernelOps()


def _main(argv: list[str]) -> None:
    from multiprocessing.connection import Connection

    fd, backing, mountpoint, node_rel, rule, *hw_rel = argv
    _serve(backing, mountpoint, node_rel, hw_rel, rule, Connection(int(fd)))


if __name__ == "__main__":
    _main(sys.argv[1:])
