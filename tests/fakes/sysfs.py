"""Build fake Jetson AGX Orin sysfs trees (JetPack 5 and JetPack 6) under a temporary root.

The layout mirrors the real kernels: the devfreq class entry is a relative symlink into
/sys/devices, `device` and `of_node` are relative symlinks, the devicetree `name` property ends
in a NUL byte, INA3221 chips appear under the i2c driver as symlinks to their device, each with
a hwmon directory of in{N}_label / in{N}_input (mV) / curr{N}_input (mA), one "NC" channel and the
channel-7 shunt sum.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

ORIN_TABLE_HZ = [306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
                 1020000000, 1122000000, 1224000000, 1300500000]


@dataclasses.dataclass
class FakeJetson:
    root: Path
    node: Path  # the devfreq node (real directory under sys/devices)
    hwmon: list[Path]

    def read(self, name: str) -> str:
        return (self.node / name).read_text().strip()

    @property
    def range_hz(self) -> tuple[int, int]:
        return int(self.read("min_freq")), int(self.read("max_freq"))

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


def _devfreq(root: Path, dev_rel: str, node_name: str, of_rel: str, of_name: str, governor: str = "nvhost_podgov") -> Path:
    dev = root / dev_rel
    node = dev / "devfreq" / node_name
    _w(node / "available_frequencies", " ".join(str(h) for h in ORIN_TABLE_HZ) + " \n")
    _w(node / "min_freq", f"{ORIN_TABLE_HZ[0]}\n")
    _w(node / "max_freq", f"{ORIN_TABLE_HZ[-1]}\n")
    _w(node / "cur_freq", f"{ORIN_TABLE_HZ[-1]}\n")
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


def make_orin_tree(root: Path, jetpack: int = 6) -> FakeJetson:
    """A fake AGX Orin 64 GB: GPU devfreq, a non-GPU devfreq node, two INA3221 chips."""
    root.mkdir(parents=True, exist_ok=True)
    if jetpack == 5:
        node = _devfreq(root, "sys/devices/17000000.ga10b", "17000000.ga10b", "ga10b@17000000", "ga10b")
    else:
        node = _devfreq(root, "sys/devices/platform/bus@0/17000000.gpu", "17000000.gpu", "bus@0/gpu@17000000", "gpu")
    # Another devfreq device that discovery must skip (the video image compositor).
    _devfreq(root, "sys/devices/platform/15340000.vic", "15340000.vic", "vic@15340000", "vic", governor="simple_ondemand")
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
    _w(root / "proc/device-tree/model", "NVIDIA Jetson AGX Orin Developer Kit\x00")
    return FakeJetson(root=root, node=node, hwmon=[chip1, chip2])


def make_old_ina_tree(root: Path) -> Path:
    """The older ina3221x iio layout (rail_name_N, in_voltageN_input, in_currentN_input, in_powerN_input)."""
    iio = root / "sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
    for n, (name, mv, ma) in enumerate([("GPU", 5000, 1000), ("CPU", 5000, 600), ("SOC", 5000, 200)]):
        _w(iio / f"rail_name_{n}", name + "\n")
        _w(iio / f"in_voltage{n}_input", f"{mv}\n")
        _w(iio / f"in_current{n}_input", f"{ma}\n")
        _w(iio / f"in_power{n}_input", f"{mv * ma // 1000}\n")
    return iio
