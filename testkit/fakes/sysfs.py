"""Build fake Jetson Orin sysfs trees (JetPack 5 and JetPack 6) under a temporary root: an AGX Orin 64 GB by default,
or another Orin module (`make_orin_tree(module=...)`, `ORIN_MODULES`).

The layout mirrors the real kernels: the devfreq class entry is a relative symlink into
/sys/devices, `device` and `of_node` are relative symlinks, the devicetree `name` property ends
in a NUL byte, INA3221 chips appear under the i2c driver as symlinks to their device, each with
a hwmon directory of in{N}_label / in{N}_input (mV) / curr{N}_input (mA), one "NC" channel and the
channel-7 shunt sum. The module's rail set: AGX Orin's four rails on two chips, Orin NX/Nano's VDD_IN,
VDD_CPU_GPU_CV and VDD_SOC on one. The device tree's root `model` and `compatible` (the module's P-number;
/proc/device-tree is a link to /sys/firmware/devicetree/base). Besides sysfs: thermal zones
(sys/class/thermal/thermal_zone{N}/type, temp in millidegrees C), the EMC clock in debugfs, the over-current
throttling counters (hwmon "soctherm_oc"), the kernel's boot id, and nvpmodel's files (etc/nvpmodel.conf,
var/lib/nvpmodel/status) with the GPU's TPC power-gating mask the mode set (sys/devices/gpu.0/tpc_pg_mask). BPMP's
measured GPC clock counters are not there unless `set_gpc_clock_hz` adds them.

The CPU clusters as cpufreq policies (Linux Documentation/admin-guide/pm/cpufreq.rst, "Policy Interface in sysfs":
/sys/devices/system/cpu/cpufreq/policyX with affected_cpus, related_cpus, cpuinfo_{min,max,cur}_freq,
scaling_available_frequencies, scaling_{min,max,cur}_freq, scaling_governor ..., every frequency in kHz, and each
CPU's cpufreq folder a symbolic link to its policy's), one policy per cluster as NVIDIA's Orin nvpmodel template names
them (CPU_A78_0 -> cpu0, CPU_A78_1 -> cpu4, CPU_A78_2 -> cpu8: mlcommons/inference_results_v3.0
closed/Neuchips/code/common/nvpmodel_orin.py). The memory (EMC) clock as BPMP's debugfs shows it
(sys/kernel/debug/bpmp/debug/clk/emc/{rate, min_rate, max_rate, mrq_rate_locked, state}: the files NVIDIA's
jetson_clocks reads and writes, /usr/bin/jetson_clocks of Jetson Linux r35/r36, do_emc), BPMP's EMC table
(sys/kernel/debug/bpmp/debug/emc/possible_rates, kHz) and nvpmodel's EMC cap (sys/kernel/nvpmodel_emc_cap/emc_iso_cap).

nvpmodel has no cap of its own: a mode's `GPU MIN_FREQ`/`GPU MAX_FREQ` are written into the GPU devfreq node's
min_freq/max_freq, the same files a user writes (NVIDIA's Orin nvpmodel template maps `< PARAM TYPE=CLOCK NAME=GPU >`
MAX_FREQ/MIN_FREQ onto .../devfreq/17000000.ga10b/max_freq and min_freq, and `TPC_POWER_GATING TPC_PG_MASK` onto
/sys/devices/gpu.0/tpc_pg_mask: mlcommons/inference_results_v3.0 closed/Neuchips/code/common/nvpmodel_orin.py).
`apply_nvpmodel_mode` does that to a tree.

These are plain files: reading cur_freq returns whatever was last written. `FakeKernel` writes them as the kernel
shows them (reads of min_freq/max_freq, scaling_min_freq/scaling_max_freq aggregate the user's request with a thermal
cap; the EMC rate is the one locked while mrq_rate_locked is 1, else the kernel's); for a tree served like sysfs (every
read computed, injected EIO), use testkit/fakes/kernelfs.py. Both apply the rules below (`cpufreq_policy_range`,
`emc_rate_shown`), which cite the kernel and NVIDIA sources they follow.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import re
import time
from pathlib import Path

ORIN_TABLE_HZ = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
                 1020000000, 1122000000, 1224000000, 1300500000]


@dataclasses.dataclass(frozen=True)
class NvpMode:
    """One nvpmodel power mode of the fake board's conf, its values as nvpmodel.conf writes them.

    Attributes:
        mode_id, name: `< POWER_MODEL ID=.. NAME=.. >`.
        gpu_max_hz: GPU MAX_FREQ in Hz (-1: no cap).
        tpc_pg_mask: TPC_POWER_GATING TPC_PG_MASK.
        cpu_max_khz: each CPU cluster's CPU_A78_<k> MAX_FREQ in kHz (-1: no cap).
        cpu_min_khz: each cluster's MIN_FREQ in kHz (0: no floor). NVIDIA's Orin Nano Super conf gives every mode a
            CPU MIN_FREQ of 729600 kHz; the fake's capped modes do the same, so the user-level range a restore writes
            back is told apart from cpuinfo_min_freq.
        emc_max_hz: EMC MAX_FREQ in Hz, written to emc_iso_cap (0: no cap).
    The names are the AGX Orin's; the caps and masks are the fake's own (NVIDIA's conf per module has its own).
    """

    mode_id: int
    name: str
    gpu_max_hz: int
    tpc_pg_mask: int
    cpu_max_khz: int = -1
    cpu_min_khz: int = 0
    emc_max_hz: int = 0


NVPMODEL_MODES = [NvpMode(0, "MAXN", -1, 0),
                  NvpMode(1, "MODE_15W", 408000000, 0xC, cpu_max_khz=1113600, cpu_min_khz=729600, emc_max_hz=2133000000),
                  NvpMode(2, "MODE_30W", 612000000, 0x8, cpu_max_khz=1728000, cpu_min_khz=729600, emc_max_hz=2133000000),
                  NvpMode(3, "MODE_50W", 816000000, 0, cpu_max_khz=1497600, cpu_min_khz=729600)]
# Where nvpmodel writes the TPC power-gating mask (the template's `< PARAM TYPE=FILE NAME=TPC_POWER_GATING >`).
TPC_PG_MASK_FILE = "sys/devices/gpu.0/tpc_pg_mask"
EMC_RATE_HZ = 3199000000
# BPMP's EMC clock in debugfs (root only): the files jetson_clocks (Jetson Linux r35/r36 /usr/bin/jetson_clocks, do_emc)
# uses on tegra186/194/234: min_rate, max_rate, rate (read and written) and mrq_rate_locked ("FreqOverride"); `state`
# is the clock's enable state. BPMP's table of the rates the EMC runs at: possible_rates, kHz ("204000 665600 2133000"
# read on an Orin NX). `EMC_RATES_HZ` is that table up to the module's maximum (`OrinModule.emc_max_hz`).
EMC_CLK_DIR = "sys/kernel/debug/bpmp/debug/clk/emc"
EMC_POSSIBLE_RATES = "sys/kernel/debug/bpmp/debug/emc/possible_rates"
EMC_RATES_HZ = (204000000, 665600000, 2133000000, 3199000000)
# nvpmodel's EMC cap: nvpmodel writes a mode's EMC MAX_FREQ here (the template's `< PARAM TYPE=FILE NAME=EMC >
# MAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap`); the kernel shows the value written (emc_iso_cap_show).
EMC_ISO_CAP = "sys/kernel/nvpmodel_emc_cap/emc_iso_cap"
# cpufreq (Linux Documentation/admin-guide/pm/cpufreq.rst): one policy folder per CPU cluster, frequencies in kHz.
CPUFREQ_DIR = "sys/devices/system/cpu/cpufreq"
# The Orin's CPU table: 115200 kHz, then 76800 kHz steps, then the module's maximum (an Orin NX 16 GB reads
# "115200 192000 ... 1881600 1958400 1984000"). The governors the fake lists (the kernel's own generic ones).
CPU_TABLE_BASE_KHZ = 115200
CPU_TABLE_STEP_KHZ = 76800
CPU_GOVERNORS = "userspace performance schedutil"
GPU_TEMP_MC = 45500  # millidegrees C
CPU_TEMP_MC = 44000
# The kernel's boot id: "a UUID generated the first time this is retrieved, and unvarying after that" (Linux
# Documentation/admin-guide/sysctl/kernel.rst, "random"); a reboot makes a new one (`reboot`).
BOOT_ID = "6f1d0c2e-3b5a-4e8f-9a7d-2c4b6e8f0a1b"
BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"
# BPMP's GPC clock counters (Hz) that jetson-stats reads as the GPU's measured clock (rbonghi/jetson_stats
# jtop/core/gpu.py @f41d5ca, igpu_read_freq(), l.120-129): debugfs, root only.
GPC_CLOCK_FILES = ("sys/kernel/debug/bpmp/debug/clk/nafll_gpc0/pto_counter",
                   "sys/kernel/debug/bpmp/debug/clk/nafll_gpc1/pto_counter")
# NVIDIA's tegra23x_oc_event driver (Jetson Linux r35/r36 kernel sources, tegra23x_oc_event.c) registers the hwmon
# device "soctherm_oc" with read-only, cumulative oc{1,2,3}_event_cnt and oc{1,2,3}_throt_en; its platform device is
# soctherm-oc-event. The hwmon class links every hwmon device under /sys/class/hwmon.
OC_HWMON_REL = "sys/devices/platform/soctherm-oc-event/hwmon/hwmon3"


@dataclasses.dataclass(frozen=True)
class OrinModule:
    """One Orin module as its device tree and rails show it.

    `compatible` follows Linux's Jetson device trees, carrier+module first, then the module, then the SoC:
    arch/arm64/boot/dts/nvidia/tegra234-p3737-0000+p3701-0000.dts ("nvidia,p3737-0000+p3701-0000",
    "nvidia,p3701-0000", "nvidia,tegra234"; model "NVIDIA Jetson AGX Orin Developer Kit"),
    tegra234-p3768-0000+p3767-0000.dts (model "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"),
    tegra234-p3768-0000+p3767-0005.dts (model "NVIDIA Jetson Orin Nano Developer Kit"); the carrier+module strings of
    the other SKUs are those NVIDIA/jetson-gpio lists (lib/python/Jetson/GPIO/gpio_pin_data.py @8e5f0a0, l.80-135).
    `gpu_max_hz`: the module data sheet's GPU maximum frequency (Jetson AGX Orin Series, Jetson Orin NX Series
    DS-10712-001 and Jetson Orin Nano Series data sheets: AGX Orin 64 GB 1.3 GHz, 32 GB 930 MHz, Orin NX 16 GB 918 MHz,
    8 GB 765 MHz, Orin Nano 625 MHz); the fake's devfreq table is the 64 GB table up to it (NVIDIA documents no
    per-module table). The CPU clusters and maximum CPU clock are the same data sheets' (AGX Orin 64 GB: 12 Arm
    Cortex-A78AE cores, 2.2 GHz; 32 GB: 8 cores, 2.2 GHz; Orin NX 16 GB: 8 cores, 2 GHz; 8 GB: 6 cores, 2 GHz; Orin
    Nano: 6 cores, 1.5 GHz), in clusters of four (NVIDIA's Orin device trees: cpu0-3, cpu4-7, cpu8-11; the
    "opp-1984000000 /* Max CPU freq for ONX */" of NVIDIA's p3701-as-p3767 emulation overlay). The EMC maximum follows the
    data sheets' memory (LPDDR5 at 3200 MHz on AGX Orin and Orin NX, 2133 MHz on Orin Nano).
    """

    part: str
    carrier: str
    model: str
    rails: str  # "agx" or "nx": the INA3221 rail set
    gpu_max_hz: int
    cpu_clusters: tuple[int, ...] = (4, 4, 4)  # CPUs per cluster (one cpufreq policy each)
    cpu_max_khz: int = 2201600
    emc_max_hz: int = 3199000000
    super_dt: bool = False

    @property
    def compatible(self) -> str:
        module = self.part + ("-super" if self.super_dt else "")
        return f"nvidia,{self.carrier}+{module}\x00nvidia,{module}\x00nvidia,tegra234\x00"


_AGX_MODEL = "NVIDIA Jetson AGX Orin Developer Kit"
_NX_MODEL = "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
_NANO_MODEL = "NVIDIA Jetson Orin Nano Developer Kit"
_NX_CPU = {"cpu_max_khz": 1984000}
_NANO_CPU = {"cpu_clusters": (4, 2), "cpu_max_khz": 1510400, "emc_max_hz": 2133000000}
ORIN_MODULES = {
    "p3701-0005": OrinModule("p3701-0005", "p3737-0000", _AGX_MODEL, "agx", 1300500000),
    "p3701-0000": OrinModule("p3701-0000", "p3737-0000", _AGX_MODEL, "agx", 1300500000),  # the first developer kit's
    "p3701-0004": OrinModule("p3701-0004", "p3737-0000", _AGX_MODEL, "agx", 930000000, cpu_clusters=(4, 4)),
    "p3767-0000": OrinModule("p3767-0000", "p3768-0000", _NX_MODEL, "nx", 918000000, cpu_clusters=(4, 4), **_NX_CPU),
    "p3767-0001": OrinModule("p3767-0001", "p3768-0000", _NX_MODEL, "nx", 765000000, cpu_clusters=(4, 2), **_NX_CPU),
    "p3767-0003": OrinModule("p3767-0003", "p3768-0000", _NANO_MODEL, "nx", 625000000, **_NANO_CPU),
    "p3767-0004": OrinModule("p3767-0004", "p3768-0000", _NANO_MODEL, "nx", 625000000, **_NANO_CPU),
    "p3767-0005": OrinModule("p3767-0005", "p3768-0000", _NANO_MODEL, "nx", 625000000, **_NANO_CPU),
}


def cpu_table_khz(max_khz: int) -> list[int]:
    """The fake's CPU table up to `max_khz` (`CPU_TABLE_BASE_KHZ` in `CPU_TABLE_STEP_KHZ` steps, then the maximum)."""
    table = list(range(CPU_TABLE_BASE_KHZ, max_khz, CPU_TABLE_STEP_KHZ))
    return [*table, max_khz]


def emc_rates_hz(max_hz: int) -> list[int]:
    """BPMP's EMC table up to `max_hz` (`EMC_RATES_HZ`)."""
    return [r for r in EMC_RATES_HZ if r <= max_hz]


@dataclasses.dataclass
class FakeJetson:
    root: Path
    node: Path  # the devfreq node (real directory under sys/devices)
    hwmon: list[Path]

    def read(self, name: str) -> str:
        """One attribute's value. A plain file is truncated before it is rewritten, so a reader racing a
        writer in another process can see it empty for a moment; sysfs never shows that, so wait it out."""
        deadline = time.monotonic() + 2.0
        while True:
            text = (self.node / name).read_text().strip()
            if text or time.monotonic() > deadline:
                return text
            time.sleep(0.001)

    @property
    def range_hz(self) -> tuple[int, int]:
        return int(self.read("min_freq")), int(self.read("max_freq"))

    @property
    def table_hz(self) -> list[int]:
        return sorted(int(x) for x in self.read("available_frequencies").split())

    # the CPU policies and the EMC clock ------------------------------------------------------------------------------
    @property
    def policies(self) -> list[Path]:
        """The cpufreq policy folders, by policy number."""
        found = (self.root / CPUFREQ_DIR).glob("policy*")
        return sorted(found, key=lambda p: int(p.name.removeprefix("policy")))

    def policy(self, name: str) -> Path:
        return self.root / CPUFREQ_DIR / name

    def cpu_range_khz(self, name: str) -> tuple[int, int]:
        """scaling_min_freq and scaling_max_freq of policy `name` as they read now."""
        pol = self.policy(name)
        return _read_int(pol / "scaling_min_freq"), _read_int(pol / "scaling_max_freq")

    def cpu_table_khz(self, name: str) -> list[int]:
        return sorted(int(x) for x in (self.policy(name) / "scaling_available_frequencies").read_text().split())

    @property
    def emc(self) -> Path:
        return self.root / EMC_CLK_DIR

    def emc_state(self) -> tuple[int, int]:
        """(mrq_rate_locked, rate in Hz) as they read now."""
        return _read_int(self.emc / "mrq_rate_locked"), _read_int(self.emc / "rate")

    def set_rail(self, label: str, mv: int, ma: int) -> None:
        for hw in self.hwmon:
            for n in range(1, 9):
                lf = hw / f"in{n}_label"
                if lf.exists() and lf.read_text().strip() == label:
                    (hw / f"in{n}_input").write_text(f"{mv}\n")
                    (hw / f"curr{n}_input").write_text(f"{ma}\n")
                    return
        raise KeyError(label)


def _w(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _read_int(path: Path) -> int:
    """A plain file's number; a reader racing a writer in another process may see it empty for a moment (see
    `FakeJetson.read`), so that is waited out."""
    deadline = time.monotonic() + 2.0
    while True:
        text = path.read_text().strip()
        if text or time.monotonic() > deadline:
            return int(text)
        time.sleep(0.001)


def _link(link: Path, target: str) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(target, link)


def _devfreq(root: Path, dev_rel: str, node_name: str, of_rel: str, of_name: str, governor: str = "nvhost_podgov",
             table_hz: list[int] | None = None) -> Path:
    dev = root / dev_rel
    node = dev / "devfreq" / node_name
    table = table_hz or ORIN_TABLE_HZ
    _w(node / "available_frequencies", " ".join(str(h) for h in table) + " \n")
    _w(node / "min_freq", f"{table[0]}\n")
    _w(node / "max_freq", f"{table[-1]}\n")
    _w(node / "cur_freq", f"{table[-1]}\n")
    _w(node / "governor", f"{governor}\n")
    _w(node / "available_governors", "wmark_active nvhost_podgov userspace performance simple_ondemand\n")
    _w(dev / "load", "523\n")
    _link(node / "device", "../../../" + dev.name)
    depth = len(Path(dev_rel).parts) - 1  # from the device dir back to sys/
    _w(root / "sys/firmware/devicetree/base" / of_rel / "name", of_name + "\x00")
    _link(dev / "of_node", "../" * depth + "firmware/devicetree/base/" + of_rel)
    class_link = root / "sys/class/devfreq" / node_name
    _link(class_link, "../../" + dev_rel.removeprefix("sys/") + "/devfreq/" + node_name)
    return node


def _ina3221(root: Path, addr: str, channels: dict[int, tuple[str, int, int]]) -> Path:
    dev_rel = f"devices/platform/bus@0/c240000.i2c/i2c-1/1-{addr}"
    hw = root / "sys" / dev_rel / "hwmon" / f"hwmon{int(addr, 16) - 0x3f}"
    _w(hw / "name", "ina3221\n")
    for n, (label, mv, ma) in channels.items():
        _w(hw / f"in{n}_label", label + "\n")
        _w(hw / f"in{n}_input", f"{mv}\n")
        _w(hw / f"curr{n}_input", f"{ma}\n")
        _w(hw / f"shunt{n}_resistor", "5000\n")
    _link(root / "sys/bus/i2c/drivers/ina3221" / f"1-{addr}", "../../../../" + dev_rel)
    return hw


def make_orin_tree(root: Path, jetpack: int = 6, nvpmodel_mode: int = 0, module: str = "p3701-0005",
                   super_dt: bool = False) -> FakeJetson:
    """A fake Orin module (default: AGX Orin 64 GB, p3701-0005; `ORIN_MODULES` lists the others): GPU devfreq with the
    module's table, a non-GPU devfreq node, its INA3221 rail set, its device tree (`super_dt`: JetPack 6.2's Super
    device tree), thermal zones, its CPU clusters as cpufreq policies, BPMP's EMC clock, the over-current counters, a
    boot id, and nvpmodel in mode `nvpmodel_mode` (0 MAXN, 1 15 W, 2 30 W, 3 50 W; a capped mode also leaves its GPU
    cap in max_freq, its CPU range in scaling_min_freq/scaling_max_freq and its EMC cap in emc_iso_cap, as nvpmodel
    does)."""
    spec = dataclasses.replace(ORIN_MODULES[module], super_dt=super_dt)
    table = [h for h in ORIN_TABLE_HZ if h <= spec.gpu_max_hz]
    root.mkdir(parents=True, exist_ok=True)
    if jetpack == 5:
        node = _devfreq(root, "sys/devices/17000000.ga10b", "17000000.ga10b", "ga10b@17000000", "ga10b", table_hz=table)
    else:
        node = _devfreq(root, "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu", "bus@0/gpu@17000000", "gpu",
                        table_hz=table)
    # Another devfreq device that discovery must skip (the video image compositor).
    _devfreq(root, "sys/devices/platform/15340000.vic", "15340000.vic", "vic@15340000", "vic", governor="simple_ondemand")
    hwmon = _agx_rails(root) if spec.rails == "agx" else _nx_rails(root)
    _device_tree(root, spec)
    _thermal(root, jetpack)
    firsts = _cpufreq(root, spec)
    _emc(root, spec)
    _oc_counters(root)
    _w(root / BOOT_ID_FILE, BOOT_ID + "\n")
    _w(root / "etc/nvpmodel.conf", nvpmodel_conf("/" + str(node.relative_to(root)), firsts))
    fake = FakeJetson(root=root, node=node, hwmon=hwmon)
    apply_nvpmodel_mode(fake, nvpmodel_mode)
    return fake


def _cpufreq(root: Path, spec: OrinModule) -> list[int]:
    """One cpufreq policy per CPU cluster (`OrinModule.cpu_clusters`), named after its first CPU (cpufreq.rst:
    "policyX", X the number of the first CPU it was created for), each CPU's cpufreq folder a relative link to it and
    each CPU online. The user's requests start at cpuinfo_min_freq..cpuinfo_max_freq (the kernel's defaults before any
    request); the governor is schedutil (L4T's default on Orin). Returns the policies' first CPUs."""
    table = cpu_table_khz(spec.cpu_max_khz)
    firsts, first = [], 0
    for n in spec.cpu_clusters:
        cpus = list(range(first, first + n))
        pol = root / CPUFREQ_DIR / f"policy{first}"
        listed = " ".join(str(c) for c in cpus) + "\n"
        for name, text in (("affected_cpus", listed), ("related_cpus", listed), ("cpuinfo_min_freq", f"{table[0]}\n"),
                           ("cpuinfo_max_freq", f"{table[-1]}\n"), ("cpuinfo_cur_freq", f"{table[-1]}\n"),
                           ("cpuinfo_transition_latency", "0\n"),
                           ("scaling_available_frequencies", " ".join(str(k) for k in table) + " \n"),
                           ("scaling_available_governors", CPU_GOVERNORS + "\n"), ("scaling_driver", "tegra194\n"),
                           ("scaling_governor", "schedutil\n"), ("scaling_min_freq", f"{table[0]}\n"),
                           ("scaling_max_freq", f"{table[-1]}\n"), ("scaling_cur_freq", f"{table[-1]}\n"),
                           ("scaling_setspeed", "<unsupported>\n")):
            _w(pol / name, text)
        (pol / "cpuinfo_cur_freq").chmod(0o400)  # cpufreq.rst: "only root can read it"
        for c in cpus:
            _link(root / f"sys/devices/system/cpu/cpu{c}/cpufreq", f"../cpufreq/policy{first}")
            _w(root / f"sys/devices/system/cpu/cpu{c}/online", "1\n")
        firsts.append(first)
        first += n
    return firsts


def _emc(root: Path, spec: OrinModule) -> None:
    """BPMP's EMC clock in debugfs (`EMC_CLK_DIR`): rate at the module's top (the kernel's choice under load), its
    min_rate/max_rate the table's ends, not locked; BPMP's table (`EMC_POSSIBLE_RATES`, kHz); nvpmodel's cap file."""
    rates = emc_rates_hz(spec.emc_max_hz)
    emc = root / EMC_CLK_DIR
    for name, value in (("rate", rates[-1]), ("min_rate", rates[0]), ("max_rate", rates[-1]), ("mrq_rate_locked", 0),
                        ("state", 1)):
        _w(emc / name, f"{value}\n")
    _w(root / EMC_POSSIBLE_RATES, " ".join(str(r // 1000) for r in rates) + "\n")
    _w(root / EMC_ISO_CAP, "0\n")
    (root / "sys/kernel/debug").chmod(0o700)  # debugfs is root's


def _agx_rails(root: Path) -> list[Path]:
    """AGX Orin: INA3221 0x40 VDD_GPU_SOC, VDD_CPU_CV, VIN_SYS_5V0; 0x41 NC, VDDQ_VDD2_1V8AO, NC (NVIDIA Jetson Linux
    Developer Guide r35/r36, Platform Power and Performance, Jetson AGX Orin series power monitors; energymon/energymon
    jetson/JetsonPowerRails.md @a95cefb, "AGX Orin Series"). The watts are the fake's own."""
    chip1 = _ina3221(root, "0040", {
        1: ("VDD_GPU_SOC", 5000, 2400),   # 12.0 W
        2: ("VDD_CPU_CV", 5000, 1300),    # 6.5 W
        3: ("VIN_SYS_5V0", 5000, 500),    # 2.5 W
        7: ("sum of shunt voltages", 15000, 4200),  # channel 7: the sum, never a rail
    })
    chip2 = _ina3221(root, "0041", {
        1: ("NC", 0, 0),
        2: ("VDDQ_VDD2_1V8AO", 5000, 300),  # 1.5 W
        3: ("NC", 0, 0),
    })
    return [chip1, chip2]


NX_RAILS_W = {"VDD_IN": 12.0, "VDD_CPU_GPU_CV": 5.0, "VDD_SOC": 2.5}


def _nx_rails(root: Path) -> list[Path]:
    """Orin NX / Orin Nano: one INA3221 at 0x40, ch1 VDD_IN (the module's input, feeding the others), ch2 VDD_CPU_GPU_CV,
    ch3 VDD_SOC (NVIDIA Jetson Linux Developer Guide r35/r36, Platform Power and Performance, Jetson Orin NX/Nano series
    power monitor; the Xavier NX's same three rails: energymon JetsonPowerRails.md @a95cefb, "Xavier NX"; jetson-stats
    takes VDD_IN as the total: jtop/core/power.py @f41d5ca, total_power(), l.26-57). The watts (`NX_RAILS_W`) are the fake's own, the
    input above the sum of the two rails it feeds."""
    return [_ina3221(root, "0040", {
        1: ("VDD_IN", 5000, 2400),          # 12.0 W
        2: ("VDD_CPU_GPU_CV", 5000, 1000),  # 5.0 W
        3: ("VDD_SOC", 5000, 500),          # 2.5 W
        7: ("sum of shunt voltages", 15000, 3900),  # channel 7: the sum, never a rail
    })]


def _device_tree(root: Path, spec: OrinModule) -> None:
    """The root node's model and compatible (NUL-terminated strings) under /sys/firmware/devicetree/base, and
    /proc/device-tree as the link to it (Linux Documentation/ABI/testing/sysfs-firmware-ofw)."""
    base = root / "sys/firmware/devicetree/base"
    _w(base / "model", spec.model + "\x00")
    _w(base / "compatible", spec.compatible)
    _link(root / "proc/device-tree", "../sys/firmware/devicetree/base")


def _oc_counters(root: Path) -> None:
    """The soctherm_oc hwmon device (see OC_HWMON_REL) with every counter at 0 and throttling enabled."""
    hw = root / OC_HWMON_REL
    _w(hw / "name", "soctherm_oc\n")
    for n in (1, 2, 3):
        _w(hw / f"oc{n}_event_cnt", "0\n")
        _w(hw / f"oc{n}_throt_en", "1\n")
    _link(root / "sys/class/hwmon" / hw.name, "../../" + OC_HWMON_REL.removeprefix("sys/"))


def add_oc_events(root: Path, n: int, counter: int = 3) -> None:
    """`n` more over-current events on counter oc{counter} (the kernel's counters only grow)."""
    f = root / OC_HWMON_REL / f"oc{counter}_event_cnt"
    f.write_text(f"{int(f.read_text()) + n}\n")


def set_gpc_clock_hz(root: Path, hz: int, gpcs: int = 2) -> None:
    """Add (or set) BPMP's measured GPC clock counters (`GPC_CLOCK_FILES`), `gpcs` of them, at `hz`."""
    for rel in GPC_CLOCK_FILES[:gpcs]:
        _w(root / rel, f"{hz}\n")


def set_emc_rate_hz(root: Path, hz: int) -> None:
    """The EMC clock BPMP reports now (the memory clock moves with load and the nvpmodel mode)."""
    _w(root / "sys/kernel/debug/bpmp/debug/clk/emc/rate", f"{hz}\n")


def reboot(root: Path, boot_id: str = "0b7e4c1d-8a2f-4f6e-9c3b-1d5a7e9f2b4c") -> None:
    """What a reboot does to the tree for the journal logic: a new boot id."""
    _w(root / BOOT_ID_FILE, boot_id + "\n")


def _thermal(root: Path, jetpack: int) -> None:
    """cpu zone first, the GPU zone last: nothing may rely on a zone's index, only on its type.

    The GPU zone is thermal_zone9 so a test that writes its own thermal_zone9 replaces it.
    """
    names = ("CPU-therm", "GPU-therm") if jetpack == 5 else ("cpu-thermal", "gpu-thermal")
    for n, name, temp in ((0, names[0], CPU_TEMP_MC), (9, names[1], GPU_TEMP_MC)):
        zone = root / f"sys/devices/virtual/thermal/thermal_zone{n}"
        _w(zone / "type", name + "\n")
        _w(zone / "temp", f"{temp}\n")
        _link(root / f"sys/class/thermal/thermal_zone{n}", f"../../devices/virtual/thermal/thermal_zone{n}")


def nvpmodel_conf(node: str = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu",
                  cpu_firsts: tuple[int, ...] | list[int] = (0, 4, 8)) -> str:
    """An nvpmodel.conf laid out as NVIDIA's: the PARAM section naming each knob's file (the GPU's clock is the devfreq
    node `node`; each CPU cluster's clock, CPU_A78_<k>, the cpufreq files of its first CPU, `cpu_firsts`; the EMC cap
    emc_iso_cap), then one POWER_MODEL block per `NVPMODEL_MODES` entry, then PM_CONFIG (mlcommons/inference_results_v3.0
    closed/Neuchips/code/common/nvpmodel_orin.py, nvpmodel_template_orin). The PARAM section holds bare `MAX_FREQ
    /sys/...` lines outside any mode: a reader must take a mode's values from its own block only."""
    cpu_params = "".join(
        f"< PARAM TYPE=CLOCK NAME=CPU_A78_{k} >\nFREQ_TABLE /sys/devices/system/cpu/cpu{c}/cpufreq/scaling_available_frequencies\n"
        f"MAX_FREQ /sys/devices/system/cpu/cpu{c}/cpufreq/scaling_max_freq\n"
        f"MIN_FREQ /sys/devices/system/cpu/cpu{c}/cpufreq/scaling_min_freq\n\n" for k, c in enumerate(cpu_firsts))
    params = ("< PARAM TYPE=FILE NAME=CPU_ONLINE >\nCORE_0 /sys/devices/system/cpu/cpu0/online\n\n"
              f"< PARAM TYPE=FILE NAME=TPC_POWER_GATING >\nTPC_PG_MASK /{TPC_PG_MASK_FILE}\n\n"
              "< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_ENABLE >\nGPU_PWR_CNTL_EN /sys/devices/gpu.0/power/control\n\n"
              f"{cpu_params}"
              f"< PARAM TYPE=CLOCK NAME=GPU >\nFREQ_TABLE {node}/available_frequencies\nMAX_FREQ {node}/max_freq\n"
              f"MIN_FREQ {node}/min_freq\n\n"
              f"< PARAM TYPE=FILE NAME=EMC >\nMAX_FREQ /{EMC_ISO_CAP}\n\n")
    blocks = []
    for m in NVPMODEL_MODES:
        cpu = "".join(f"CPU_A78_{k} MIN_FREQ {m.cpu_min_khz}\nCPU_A78_{k} MAX_FREQ {m.cpu_max_khz}\n" for k in range(len(cpu_firsts)))
        blocks.append(f"< POWER_MODEL ID={m.mode_id} NAME={m.name} >\nCPU_ONLINE CORE_0 1\nTPC_POWER_GATING TPC_PG_MASK {m.tpc_pg_mask}\n"
                      f"GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on\n{cpu}GPU MIN_FREQ 0\nGPU MAX_FREQ {m.gpu_max_hz}\n"
                      f"GPU_POWER_CONTROL_DISABLE GPU_PWR_CNTL_DIS auto\nEMC MAX_FREQ {m.emc_max_hz}\n")
    return params + "\n".join(blocks) + "\n# mandatory section to configure the default power mode\n< PM_CONFIG DEFAULT=0 >\n"


def nvpmodel_mode(mode_id: int) -> NvpMode:
    """The mode of the fake conf with id `mode_id`.

    Raises:
        KeyError: no such mode.
    """
    for m in NVPMODEL_MODES:
        if m.mode_id == mode_id:
            return m
    raise KeyError(mode_id)


def nvpmodel_gpu_cap_hz(mode_id: int) -> int | None:
    """The GPU MAX_FREQ of a mode of the fake conf (None: no cap)."""
    gpu_max = nvpmodel_mode(mode_id).gpu_max_hz
    return gpu_max if gpu_max > 0 else None


def _conf_sections(text: str, mode_id: int) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], str]]:
    """(the mode's (name, arg) -> value, every PARAM's (name, arg) -> file) of an nvpmodel.conf."""
    values: dict[tuple[str, str], int] = {}
    files: dict[tuple[str, str], str] = {}
    current, param = None, None
    for line in text.splitlines():
        if line.lstrip().startswith("<"):
            head = re.match(r"\s*<\s*POWER_MODEL\s+ID=(\d+)", line)
            current = int(head.group(1)) if head else None
            param_head = re.match(r"\s*<\s*PARAM\s+TYPE=\w+\s+NAME=(\w+)", line)
            param = param_head.group(1) if param_head else None
            continue
        words = line.split()
        if param is not None and len(words) == 2:
            files[(param, words[0])] = words[1]
        if current == mode_id and len(words) == 3 and re.fullmatch(r"-?\d+", words[2]):
            values[(words[0], words[1])] = int(words[2])
    return values, files


def apply_nvpmodel_mode(fake: FakeJetson, mode_id: int) -> None:
    """What `nvpmodel -m MODE_ID` leaves in the tree, from the mode's block of the tree's etc/nvpmodel.conf: its status
    file, the mode's GPU MIN_FREQ/MAX_FREQ written into the devfreq node's min_freq/max_freq (the user's request files:
    nvpmodel has no other cap) and its TPC_PG_MASK into the TPC power-gating file. MIN_FREQ 0 is no lower limit (the
    table's lowest clock) and MAX_FREQ -1 no cap (the table's top: nvpmodel shows its CONF_VAL 2147483647 for -1 with a
    REAL_VAL of the table's top), as the devfreq node then reads them. Each CPU cluster's MIN_FREQ/MAX_FREQ (kHz) go the
    same way into the cpufreq files its PARAM section names (scaling_min_freq/scaling_max_freq, the user's requests),
    and EMC MAX_FREQ into emc_iso_cap as written (a FILE parameter: the value itself).

    Raises:
        KeyError: the conf has no such mode.
    """
    values, files = _conf_sections((fake.root / "etc/nvpmodel.conf").read_text(), mode_id)
    if not values:
        raise KeyError(mode_id)
    table = fake.table_hz
    gpu_min, gpu_max = values.get(("GPU", "MIN_FREQ"), 0), values.get(("GPU", "MAX_FREQ"), -1)
    _w(fake.root / "var/lib/nvpmodel/status", f"pmode:{mode_id:04d} fmode:quiet\n")
    low = min(max(gpu_min, table[0]), table[-1])
    top = min(gpu_max, table[-1]) if gpu_max > 0 else table[-1]
    _w(fake.node / "min_freq", f"{low}\n")
    _w(fake.node / "max_freq", f"{top}\n")
    _w(fake.node / "cur_freq", f"{max([h for h in table if h <= top] or table[:1])}\n")
    if ("TPC_POWER_GATING", "TPC_PG_MASK") in values:
        _w(fake.root / TPC_PG_MASK_FILE, f"{values[('TPC_POWER_GATING', 'TPC_PG_MASK')]}\n")
    for (name, arg), value in values.items():
        path = files.get((name, arg))
        if not name.startswith("CPU_A78") or path is None:
            continue
        pol = (fake.root / path.lstrip("/")).parent
        cpu_table = sorted(int(x) for x in (pol / "scaling_available_frequencies").read_text().split())
        if arg == "MIN_FREQ":
            _w(pol / "scaling_min_freq", f"{min(max(value, cpu_table[0]), cpu_table[-1])}\n")
        elif arg == "MAX_FREQ":
            _w(pol / "scaling_max_freq", f"{min(value, cpu_table[-1]) if value > 0 else cpu_table[-1]}\n")
    if ("EMC", "MAX_FREQ") in values and ("EMC", "MAX_FREQ") in files:
        emc_max = values[("EMC", "MAX_FREQ")]
        _w(fake.root / files[("EMC", "MAX_FREQ")].lstrip("/"), f"{emc_max if emc_max >= 0 else 2**64 + emc_max}\n")


def make_old_ina_tree(root: Path) -> Path:
    """The older ina3221x iio layout (rail_name_N, in_voltageN_input, in_currentN_input, in_powerN_input)."""
    iio = root / "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
    for n, (name, mv, ma) in enumerate([("GPU", 5000, 1000), ("CPU", 5000, 600), ("SOC", 5000, 200)]):
        _w(iio / f"rail_name_{n}", name + "\n")
        _w(iio / f"in_voltage{n}_input", f"{mv}\n")
        _w(iio / f"in_current{n}_input", f"{ma}\n")
        _w(iio / f"in_power{n}_input", f"{mv * ma // 1000}\n")
    return iio


# -- the kernel's rules the fakes follow (FakeKernel here, the FUSE daemon of kernelfs.py) ---------------------------
CPUFREQ_STORE_ATTRS = ("scaling_min_freq", "scaling_max_freq", "scaling_governor")
# cpufreq attributes with no store: opening one for writing fails with EACCES, as for the devfreq node's (kernfs; the
# policy's cpuinfo_cur_freq is 0400, root only: cpufreq.rst, "cpuinfo_cur_freq ... only root can read it").
CPUFREQ_READ_ONLY_ATTRS = ("affected_cpus", "related_cpus", "cpuinfo_min_freq", "cpuinfo_max_freq", "cpuinfo_cur_freq",
                           "cpuinfo_transition_latency", "scaling_available_frequencies",
                           "scaling_available_governors", "scaling_cur_freq", "scaling_driver")
EMC_STORE_ATTRS = ("rate", "mrq_rate_locked")
EMC_READ_ONLY_ATTRS = ("min_rate", "max_rate", "possible_rates")


def parse_ulong(text: str) -> int | None:
    """sscanf(buf, "%lu"): leading blanks and an optional '+', then decimal digits; None where there are none. Both
    stores below parse so (cpufreq.c store_one: `sscanf(buf, "%lu", &val)`, EINVAL where it matches nothing;
    devfreq.c min_freq_store/max_freq_store likewise)."""
    m = re.match(r"\s*\+?(\d+)", text)
    return int(m.group(1)) if m else None


def cpufreq_policy_range(table_khz: list[int], cpuinfo_khz: tuple[int, int], min_requests: list[int],
                         max_requests: list[int]) -> tuple[int, int]:
    """What scaling_min_freq and scaling_max_freq show: policy->min and policy->max as cpufreq_set_policy() sets them
    (torvalds/linux drivers/cpufreq/cpufreq.c), never a request as written.

    - Every limit on a policy is a frequency QoS request (kernel/power/qos.c): the user's scaling_min_freq and
      scaling_max_freq writes (store_one: freq_qos_update_request), nvpmodel's (it writes the same files), and a cooling
      device's max (drivers/thermal/cpufreq_cooling.c: freq_qos_update_request on its max request). The aggregate
      (freq_qos_read_value) is the highest min request (FREQ_QOS_MIN) and the lowest max request (FREQ_QOS_MAX).
    - The driver's verify keeps them within cpuinfo_min_freq..cpuinfo_max_freq with min never above max
      (include/linux/cpufreq.h cpufreq_verify_within_limits: "if (policy->min > policy->max) policy->min =
      policy->max"), so a min written above the max reads as the max: no write is refused for it.
    - Then both are resolved to the table (__resolve_freq): the min up to the lowest table frequency at or above it
      (CPUFREQ_RELATION_L), the max down to the highest at or below it (CPUFREQ_RELATION_H).

    Args:
        table_khz: scaling_available_frequencies. cpuinfo_khz: (cpuinfo_min_freq, cpuinfo_max_freq).
        min_requests: every min request in kHz. max_requests: every max request in kHz.
    """
    lo_info, hi_info = cpuinfo_khz
    lo, hi = max(min_requests, default=0), min(max_requests, default=hi_info)
    hi = min(max(hi, lo_info), hi_info)
    lo = min(max(lo, lo_info), hi)
    table = sorted(table_khz)
    lo = min([t for t in table if t >= lo] or table[-1:])
    hi = max([t for t in table if t <= hi] or table[:1])
    return min(lo, hi), hi


def emc_rate_shown(locked: bool, debug_rate_hz: int | None, kernel_rate_hz: int) -> int:
    """What BPMP's clk/emc/rate reads: while mrq_rate_locked is 1, the rate written to `rate` (jetson_clocks sets
    the lock, then writes the rate it wants: /usr/bin/jetson_clocks of Jetson Linux r35/r36, do_emc); unlocked, the
    rate the kernel's bandwidth manager asks BPMP for, which moves with load (writing 0 to mrq_rate_locked "allow[s]
    DVFS dynamic adjustment" again)."""
    return debug_rate_hz if locked and debug_rate_hz else kernel_rate_hz


def bpmp_round_hz(hz: int, table_hz: list[int], floor_hz: int, top_hz: int) -> int:
    """The EMC rate the fake's BPMP runs a written rate at: within its min_rate..max_rate and on its table
    (possible_rates), the table's rate at or above it. No source says how BPMP rounds a debugfs write; the package only
    ever writes a rate of the table, so this choice is never what a test judges."""
    hz = min(max(hz, floor_hz), top_hz)
    table = sorted(t for t in table_hz if floor_hz <= t <= top_hz) or sorted(table_hz)
    return min([t for t in table if t >= hz] or table[-1:])


class FakeKernel:
    """The kernel's rules for a plain fake tree: JetsonDevice(writer=kernel.write) writes through it, and the files then
    read as the kernel shows them.

    devfreq, like drivers/devfreq/devfreq.c (torvalds/linux): min_freq/max_freq take a decimal integer (EINVAL
    otherwise), and a write that would leave the user's min above the user's max fails with EINVAL and changes nothing
    (the pre-5.7 min_freq_store/max_freq_store rule); governor accepts only a name from available_governors. What the
    user wrote is a request, not what reads return: min_freq_show/max_freq_show print get_freq_range(), the table's range
    narrowed by every PM QoS request, so a thermal cap (drivers/thermal/devfreq_cooling.c, devfreq_cooling_set_cur_state:
    dev_pm_qos_update_request(&dfc->req_max_freq, ...)) reads back in max_freq, and min_freq never reads above
    max_freq ("if (*min_freq > *max_freq) *min_freq = *max_freq"). cur_freq is the top of that range (the governor's
    target under load), on the table.

    cpufreq, like drivers/cpufreq/cpufreq.c: scaling_min_freq/scaling_max_freq take what sscanf("%lu") parses (EINVAL
    otherwise) as the user's frequency QoS request and read back policy->min/policy->max (`cpufreq_policy_range`: the
    requests aggregated with a cooling device's cap, within cpuinfo, min never above max, on the table); scaling_cur_freq
    and cpuinfo_cur_freq are the top of that range (the governor's target under load); scaling_governor takes a name of
    scaling_available_governors.

    BPMP's EMC clock (debugfs): mrq_rate_locked takes 0 or 1, rate a rate in Hz (`bpmp_round_hz`), and rate reads
    `emc_rate_shown`: the rate written while locked, else the kernel's (`set_emc_kernel_rate_hz`).

    Knobs: `read_only` (every write EACCES, as for a non-root user), `fail_writes` (names that fail with EIO),
    `set_cap_hz` (the GPU's thermal cap), `set_cpu_cap_khz` (a CPU cooling device's cap on one policy),
    `set_emc_floor_hz` (a floor BPMP holds: min_rate), `set_nvpmodel_mode`. Every write attempt is logged as (name,
    value, errno or 0).
    """

    def __init__(self, fake: FakeJetson):
        self.fake = fake
        self.read_only = False
        self.fail_writes: set[str] = set()
        self.cap_hz: int | None = None
        self.log: list[tuple[str, str, int]] = []
        self.user_min_hz, self.user_max_hz = fake.range_hz  # the tree's files hold the user's requests until now
        self.cpu_requests: dict[str, tuple[int, int]] = {}  # policy -> the user's (min, max) requests, kHz
        self.cpu_caps: dict[str, int] = {}  # policy -> a cooling device's max request, kHz
        self._read_cpu_requests()
        self.emc_locked = int((fake.emc / "mrq_rate_locked").read_text()) if fake.emc.is_dir() else 0
        self.emc_debug_hz: int | None = None
        self.emc_kernel_hz = int((fake.emc / "rate").read_text()) if fake.emc.is_dir() else 0
        self._render()

    def _read_cpu_requests(self) -> None:
        for pol in self.fake.policies:
            self.cpu_requests[pol.name] = (int((pol / "scaling_min_freq").read_text()), int((pol / "scaling_max_freq").read_text()))

    @property
    def writes(self) -> list[tuple[str, int]]:
        """Accepted min/max writes, as (name, Hz)."""
        return [(n, int(v)) for n, v, err in self.log if err == 0 and n in ("min_freq", "max_freq")]

    def set_cap_hz(self, hz: int | None) -> None:
        self.cap_hz = hz
        self._render()

    def set_cpu_cap_khz(self, policy: str, khz: int | None) -> None:
        """A cooling device's max request on `policy` (None: none)."""
        if khz is None:
            self.cpu_caps.pop(policy, None)
        else:
            self.cpu_caps[policy] = khz
        self._render()

    def set_emc_floor_hz(self, hz: int) -> None:
        """BPMP's EMC min_rate (a floor it holds)."""
        (self.fake.emc / "min_rate").write_text(f"{hz}\n")
        self._render()

    def set_emc_kernel_rate_hz(self, hz: int) -> None:
        """The rate the kernel's bandwidth manager asks BPMP for (shown while mrq_rate_locked is 0)."""
        self.emc_kernel_hz = hz
        self._render()

    def set_nvpmodel_mode(self, mode_id: int) -> None:
        """`nvpmodel -m MODE_ID` (root): the mode's ranges become the user's requests (`apply_nvpmodel_mode`)."""
        apply_nvpmodel_mode(self.fake, mode_id)
        self.user_min_hz, self.user_max_hz = int(self.fake.read("min_freq")), int(self.fake.read("max_freq"))
        self._read_cpu_requests()
        self._render()

    def _fail(self, name: str, value: str, err: int) -> None:
        self.log.append((name, value.strip(), err))
        raise OSError(err, os.strerror(err))

    def write(self, path: Path, value: str) -> None:
        path = Path(path)
        name, parent = path.name, path.parent.resolve()
        policy = next((p for p in self.fake.policies if p.resolve() == parent), None)
        if parent == self.fake.node.resolve():
            self._write_devfreq(name, value)
        elif policy is not None:
            self._write_cpufreq(policy, name, value)
        elif self.fake.emc.is_dir() and parent == self.fake.emc.resolve():
            self._write_emc(name, value)
        else:
            path.write_text(value)  # not a clock's file: a plain file
            return
        self.log.append((name, value.strip(), 0))
        self._render()

    def _check(self, name: str, value: str) -> None:
        if self.read_only:
            self._fail(name, value, errno.EACCES)
        if name in self.fail_writes:
            self._fail(name, value, errno.EIO)

    def _write_devfreq(self, name: str, value: str) -> None:
        self._check(name, value)
        if name in ("min_freq", "max_freq"):
            try:
                hz = int(value.strip())
            except ValueError:
                self._fail(name, value, errno.EINVAL)
            lo, hi = (hz, self.user_max_hz) if name == "min_freq" else (self.user_min_hz, hz)
            if lo > hi:
                self._fail(name, value, errno.EINVAL)
            self.user_min_hz, self.user_max_hz = lo, hi
        elif name == "governor":
            if value.strip() not in self.fake.read("available_governors").split():
                self._fail(name, value, errno.EINVAL)
            (self.fake.node / name).write_text(value.strip() + "\n")
        else:  # cur_freq, available_frequencies, available_governors: read-only attributes (0444)
            self._fail(name, value, errno.EACCES)

    def _write_cpufreq(self, policy: Path, name: str, value: str) -> None:
        self._check(name, value)
        if name in ("scaling_min_freq", "scaling_max_freq"):
            khz = parse_ulong(value)
            if khz is None:
                self._fail(name, value, errno.EINVAL)
            lo, hi = self.cpu_requests[policy.name]
            self.cpu_requests[policy.name] = (khz, hi) if name == "scaling_min_freq" else (lo, khz)
        elif name == "scaling_governor":
            if value.strip() not in (policy / "scaling_available_governors").read_text().split():
                self._fail(name, value, errno.EINVAL)
            (policy / name).write_text(value.strip() + "\n")
        else:
            self._fail(name, value, errno.EACCES)

    def _write_emc(self, name: str, value: str) -> None:
        self._check(name, value)
        number = parse_ulong(value)
        if name not in EMC_STORE_ATTRS:
            self._fail(name, value, errno.EACCES)
        if number is None or (name == "mrq_rate_locked" and number not in (0, 1)):
            self._fail(name, value, errno.EINVAL)
        if name == "mrq_rate_locked":
            self.emc_locked = number
            (self.fake.emc / name).write_text(f"{number}\n")
        else:
            self.emc_debug_hz = bpmp_round_hz(number, emc_table_hz(self.fake.root), *self._emc_limits())

    def _emc_limits(self) -> tuple[int, int]:
        return int((self.fake.emc / "min_rate").read_text()), int((self.fake.emc / "max_rate").read_text())

    def _render(self) -> None:
        """Write the files as the kernel shows them: devfreq's range and cur_freq (and BPMP's GPC counters, where the tree
        has them), each cpufreq policy's range and current clock, the EMC rate."""
        table = self.fake.table_hz
        hi = min(table[-1], self.user_max_hz or table[-1], self.cap_hz if self.cap_hz is not None else table[-1])
        lo = min(max(table[0], self.user_min_hz), hi)
        (self.fake.node / "min_freq").write_text(f"{lo}\n")
        (self.fake.node / "max_freq").write_text(f"{hi}\n")
        cur = max([t for t in table if t <= hi] or [table[0]])
        (self.fake.node / "cur_freq").write_text(f"{cur}\n")
        for rel in GPC_CLOCK_FILES:  # BPMP's counters (where the tree has them) count the clock the GPU runs at
            if (self.fake.root / rel).exists():
                (self.fake.root / rel).write_text(f"{cur}\n")
        for pol in self.fake.policies:
            lo_req, hi_req = self.cpu_requests[pol.name]
            caps = [self.cpu_caps[pol.name]] if pol.name in self.cpu_caps else []
            info = (int((pol / "cpuinfo_min_freq").read_text()), int((pol / "cpuinfo_max_freq").read_text()))
            lo_khz, hi_khz = cpufreq_policy_range(self.fake.cpu_table_khz(pol.name), info, [lo_req], [hi_req, *caps])
            for name, khz in (("scaling_min_freq", lo_khz), ("scaling_max_freq", hi_khz), ("scaling_cur_freq", hi_khz),
                              ("cpuinfo_cur_freq", hi_khz)):
                (pol / name).write_text(f"{khz}\n")
        if self.fake.emc.is_dir():
            (self.fake.emc / "rate").write_text(f"{emc_rate_shown(bool(self.emc_locked), self.emc_debug_hz, self.emc_kernel_hz)}\n")


def emc_table_hz(root: Path) -> list[int]:
    """BPMP's EMC table of a tree (`EMC_POSSIBLE_RATES`, kHz, in Hz)."""
    return [int(x) * 1000 for x in (root / EMC_POSSIBLE_RATES).read_text().split() if x.isdigit()]
