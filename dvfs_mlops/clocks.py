"""How a clock request and a configuration are written, shared by the device backends, the models and the commands.

A request is a clock in MHz or "maxn" (leave the board's default governor). A configuration (`Setting`) is the GPU
clock with the CPU and memory (EMC) clocks: the one record of a joint sweep's point, a joint search's step, a replayed
grid's row and the twin's oracle. Standard library only.
"""
from __future__ import annotations

import dataclasses

MAXN = "maxn"
FreqRequest = float | str  # a clock in MHz or "maxn"


def freq_label(freq: FreqRequest) -> str:
    """How a frequency appears in params, tags and tables: '816' or 'maxn'."""
    return MAXN if freq == MAXN else f"{float(freq):g}"


@dataclasses.dataclass(frozen=True)
class Setting:
    """One configuration: the GPU clock, and the CPU and memory (EMC) clocks where they are set.

    Attributes:
        gpu_mhz: the GPU clock (MHz).
        cpu_mhz: the CPU clock (MHz); None where it is not part of the configuration (left as the device has it; a
            replayed grid without a `cpu_mhz` column).
        emc_mhz: the memory (EMC) clock (MHz); None likewise.
    """

    gpu_mhz: float
    cpu_mhz: float | None = None
    emc_mhz: float | None = None

    def label(self) -> str:
        """How the configuration is written in messages: '905.25 MHz', or 'GPU 905.25 / CPU 2265.6 / EMC 2133 MHz'."""
        if self.cpu_mhz is None and self.emc_mhz is None:
            return f"{self.gpu_mhz:g} MHz"
        parts = [f"GPU {self.gpu_mhz:g}"]
        parts += [f"CPU {self.cpu_mhz:g}"] if self.cpu_mhz is not None else []
        parts += [f"EMC {self.emc_mhz:g}"] if self.emc_mhz is not None else []
        return " / ".join(parts) + " MHz"

    def to_dict(self) -> dict[str, float | None]:
        """The configuration as JSON: gpu_mhz, cpu_mhz, emc_mhz (None where not set)."""
        return {"gpu_mhz": self.gpu_mhz, "cpu_mhz": self.cpu_mhz, "emc_mhz": self.emc_mhz}
