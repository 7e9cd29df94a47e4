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

nvpmodel has no cap of its own: a mode's `GPU MIN_FREQ`/`GPU MAX_FREQ` are written into the GPU devfreq node's
min_freq/max_freq, the same files a user writes (NVIDIA's Orin nvpmodel template maps `< PARAM TYPE=CLOCK NAME=GPU >`
MAX_FREQ/MIN_FREQ onto .../devfreq/17000000.ga10b/max_freq and min_freq, and `TPC_POWER_GATING TPC_PG_MASK` onto
/sys/devices/gpu.0/tpc_pg_mask: mlcommons/inference_results_v3.0 closed/Neuchips/code/common/nvpmodel_orin.py).
`apply_nvpmodel_mode` does that to a tree.

These are plain files: reading cur_freq returns whatever was last written. `FakeKernel` writes them as the kernel
shows them (reads of min_freq/max_freq aggregate the user's request with a thermal cap); for a tree served like
sysfs (every read computed, injected EIO), use testkit/fakes/kernelfs.py.
"""
from __future__ import annotations

import dataclasses
import os
import re
import time
from pathlib import Path

ORIN_TABLE_HZ = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
                 1020000000, 1122000000, 1224000000, 1300500000]

# nvpmodel power modes of the fake board: (ID, NAME, GPU MAX_FREQ in Hz (-1: no cap), TPC_PG_MASK). The names are the
# AGX Orin's; the caps and masks are the fake's own (NVIDIA's conf per module has its own).
NVPMODEL_MODES = [(0, "MAXN", -1, 0), (1, "MODE_15W", 408000000, 0xC), (2, "MODE_30W", 612000000, 0x8),
                  (3, "MODE_50W", 816000000, 0)]
# Where nvpmodel writes the TPC power-gating mask (the template's `< PARAM TYPE=FILE NAME=TPC_POWER_GATING >`).
TPC_PG_MASK_FILE = "sys/devices/gpu.0/tpc_pg_mask"
EMC_RATE_HZ = 3199000000
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
    per-module table).
    """

    part: str
    carrier: str
    model: str
    rails: str  # "agx" or "nx": the INA3221 rail set
    gpu_max_hz: int
    super_dt: bool = False

    @property
    def compatible(self) -> str:
        module = self.part + ("-super" if self.super_dt else "")
        return f"nvidia,{self.carrier}+{module}\x00nvidia,{module}\x00nvidia,tegra234\x00"


_AGX_MODEL = "NVIDIA Jetson AGX Orin Developer Kit"
_NX_MODEL = "NVIDIA Jetson Orin NX Engineering Reference Developer Kit"
_NANO_MODEL = "NVIDIA Jetson Orin Nano Developer Kit"
ORIN_MODULES = {
    "p3701-0005": OrinModule("p3701-0005", "p3737-0000", _AGX_MODEL, "agx", 1300500000),
    "p3701-0000": OrinModule("p3701-0000", "p3737-0000", _AGX_MODEL, "agx", 1300500000),  # the first developer kit's
    "p3701-0004": OrinModule("p3701-0004", "p3737-0000", _AGX_MODEL, "agx", 930000000),
    "p3767-0000": OrinModule("p3767-0000", "p3768-0000", _NX_MODEL, "nx", 918000000),
    "p3767-0001": OrinModule("p3767-0001", "p3768-0000", _NX_MODEL, "nx", 765000000),
    "p3767-0003": OrinModule("p3767-0003", "p3768-0000", _NANO_MODEL, "nx", 625000000),
    "p3767-0004": OrinModule("p3767-0004", "p3768-0000", _NANO_MODEL, "nx", 625000000),
    "p3767-0005": OrinModule("p3767-0005", "p3768-0000", _NANO_MODEL, "nx", 625000000),
}


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
    device tree), thermal zones, the EMC clock, the over-current counters, a boot id, and nvpmodel in mode
    `nvpmodel_mode` (0 MAXN, 1 15 W, 2 30 W, 3 50 W; a capped mode also leaves its GPU cap in max_freq, as nvpmodel
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
    _w(root / "sys/kernel/debug/bpmp/debug/clk/emc/rate", f"{EMC_RATE_HZ}\n")
    _oc_counters(root)
    _w(root / BOOT_ID_FILE, BOOT_ID + "\n")
    _w(root / "etc/nvpmodel.conf", nvpmodel_conf("/" + str(node.relative_to(root))))
    fake = FakeJetson(root=root, node=node, hwmon=hwmon)
    apply_nvpmodel_mode(fake, nvpmodel_mode)
    return fake


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


def nvpmodel_conf(node: str = "/sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu") -> str:
    """An nvpmodel.conf laid out as NVIDIA's: the PARAM section naming each knob's file (the GPU's clock is the devfreq
    node `node`), then one POWER_MODEL block per `NVPMODEL_MODES` entry, then PM_CONFIG (mlcommons/inference_results_v3.0
    closed/Neuchips/code/common/nvpmodel_orin.py, nvpmodel_template_orin). The PARAM section holds bare `MAX_FREQ
    /sys/...` lines outside any mode: a reader must take a mode's values from its own block only."""
    params = ("< PARAM TYPE=FILE NAME=CPU_ONLINE >\nCORE_0 /sys/devices/system/cpu/cpu0/online\n\n"
              f"< PARAM TYPE=FILE NAME=TPC_POWER_GATING >\nTPC_PG_MASK /{TPC_PG_MASK_FILE}\n\n"
              "< PARAM TYPE=FILE NAME=GPU_POWER_CONTROL_ENABLE >\nGPU_PWR_CNTL_EN /sys/devices/gpu.0/power/control\n\n"
              f"< PARAM TYPE=CLOCK NAME=GPU >\nFREQ_TABLE {node}/available_frequencies\nMAX_FREQ {node}/max_freq\n"
              f"MIN_FREQ {node}/min_freq\n\n"
              "< PARAM TYPE=FILE NAME=EMC >\nMAX_FREQ /sys/kernel/nvpmodel_emc_cap/emc_iso_cap\n\n")
    blocks = []
    for mode_id, name, gpu_max, tpc_mask in NVPMODEL_MODES:
        blocks.append(f"< POWER_MODEL ID={mode_id} NAME={name} >\nCPU_ONLINE CORE_0 1\nTPC_POWER_GATING TPC_PG_MASK {tpc_mask}\n"
                      f"GPU_POWER_CONTROL_ENABLE GPU_PWR_CNTL_EN on\nGPU MIN_FREQ 0\nGPU MAX_FREQ {gpu_max}\n"
                      "GPU_POWER_CONTROL_DISABLE GPU_PWR_CNTL_DIS auto\nEMC MAX_FREQ 0\n")
    return params + "\n".join(blocks) + "\n# mandatory section to configure the default power mode\n< PM_CONFIG DEFAULT=0 >\n"


def nvpmodel_gpu_cap_hz(mode_id: int) -> int | None:
    """The GPU MAX_FREQ of a mode of the fake conf (None: no cap)."""
    for m, _name, gpu_max, _tpc in NVPMODEL_MODES:
        if m == mode_id:
            return gpu_max if gpu_max > 0 else None
    raise KeyError(mode_id)


def apply_nvpmodel_mode(fake: FakeJetson, mode_id: int) -> None:
    """What `nvpmodel -m MODE_ID` leaves in the tree, from the mode's block of the tree's etc/nvpmodel.conf: its status
    file, the mode's GPU MIN_FREQ/MAX_FREQ written into the devfreq node's min_freq/max_freq (the user's request files:
    nvpmodel has no other cap) and its TPC_PG_MASK into the TPC power-gating file. MIN_FREQ 0 is no lower limit (the
    table's lowest clock) and MAX_FREQ -1 no cap (the table's top: nvpmodel shows its CONF_VAL 2147483647 for -1 with a
    REAL_VAL of the table's top), as the devfreq node then reads them.

    Raises:
        KeyError: the conf has no such mode.
    """
    values: dict[tuple[str, str], int] = {}
    current = None
    for line in (fake.root / "etc/nvpmodel.conf").read_text().splitlines():
        if line.lstrip().startswith("<"):
            head = re.match(r"\s*<\s*POWER_MODEL\s+ID=(\d+)", line)
            current = int(head.group(1)) if head else None
            continue
        words = line.split()
        if current == mode_id and len(words) == 3 and re.fullmatch(r"-?\d+", words[2]):
            values[(words[0], words[1])] = int(words[2])
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


def make_old_ina_tree(root: Path) -> Path:
    """The older ina3221x iio layout (rail_name_N, in_voltageN_input, in_currentN_input, in_powerN_input)."""
    iio = root / "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
    for n, (name, mv, ma) in enumerate([("GPU", 5000, 1000), ("CPU", 5000, 600), ("SOC", 5000, 200)]):
        _w(iio / f"rail_name_{n}", name + "\n")
        _w(iio / f"in_voltage{n}_input", f"{mv}\n")
        _w(iio / f"in_current{n}_input", f"{ma}\n")
        _w(iio / f"in_power{n}_input", f"{mv * ma // 1000}\n")
    return iio


class FakeKernel:
    """The devfreq rules of the kernel for a plain fake tree: JetsonDevice(writer=kernel.write) writes through it, and
    the files then read as the kernel shows them.

    Like drivers/devfreq/devfreq.c (torvalds/linux): min_freq/max_freq take a decimal integer (EINVAL otherwise), and a
    write that would leave the user's min above the user's max fails with EINVAL and changes nothing (the pre-5.7
    min_freq_store/max_freq_store rule); governor accepts only a name from available_governors. What the user wrote is
    a request, not what reads return: min_freq_show/max_freq_show print get_freq_range(), the table's range narrowed by
    every PM QoS request, so a thermal cap (drivers/thermal/devfreq_cooling.c, devfreq_cooling_set_cur_state:
    dev_pm_qos_update_request(&dfc->req_max_freq, ...)) reads back in max_freq, and min_freq never reads above
    max_freq ("if (*min_freq > *max_freq) *min_freq = *max_freq"). cur_freq is the top of that range (the governor's
    target under load), on the table. Knobs: `read_only` (every write EACCES, as for a non-root user), `fail_writes`
    (names that fail with EIO), `set_cap_hz` (the thermal cap), `set_nvpmodel_mode`. Every write attempt is logged as
    (name, value, errno or 0).
    """

    def __init__(self, fake: FakeJetson):
        self.fake = fake
        self.read_only = False
        self.fail_writes: set[str] = set()
        self.cap_hz: int | None = None
        self.log: list[tuple[str, str, int]] = []
        self.user_min_hz, self.user_max_hz = fake.range_hz  # the tree's files hold the user's requests until now
        self._render()

    @property
    def writes(self) -> list[tuple[str, int]]:
        """Accepted min/max writes, as (name, Hz)."""
        return [(n, int(v)) for n, v, err in self.log if err == 0 and n in ("min_freq", "max_freq")]

    def set_cap_hz(self, hz: int | None) -> None:
        self.cap_hz = hz
        self._render()

    def set_nvpmodel_mode(self, mode_id: int) -> None:
        """`nvpmodel -m MODE_ID` (root): the mode's GPU range becomes the user's request (`apply_nvpmodel_mode`)."""
        apply_nvpmodel_mode(self.fake, mode_id)
        self.user_min_hz, self.user_max_hz = int(self.fake.read("min_freq")), int(self.fake.read("max_freq"))
        self._render()

    def _fail(self, name: str, value: str, err: int) -> None:
        self.log.append((name, value.strip(), err))
        raise OSError(err, os.strerror(err))

    def write(self, path: Path, value: str) -> None:
        import errno

        name = Path(path).name
        if Path(path).parent.resolve() != self.fake.node.resolve():
            Path(path).write_text(value)  # not the GPU's devfreq node: a plain file
            return
        if self.read_only:
            self._fail(name, value, errno.EACCES)
        if name in self.fail_writes:
            self._fail(name, value, errno.EIO)
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
        self.log.append((name, value.strip(), 0))
        self._render()

    def _render(self) -> None:
        """Write the files as get_freq_range() shows them, and cur_freq (and BPMP's counters, where the tree has them)."""
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
