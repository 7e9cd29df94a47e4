"""`import pynvml` in a test's child process: the fake NVML of testkit/fakes/fake_pynvml.py, its GPUs those of the state
file $DVFS_FAKE_NVML_STATE names (`fake_pynvml.shared_module`), shared with every other process that loads it.

A test puts this folder first on the child's PYTHONPATH (and the checkout after it, for `testkit`); product code keeps
its plain `import pynvml` (hw/nvml.py, import_nvml).
"""
import os as _os

from testkit.fakes.fake_pynvml import SHARED_STATE_ENV as _ENV
from testkit.fakes.fake_pynvml import shared_module as _shared_module

globals().update({k: v for k, v in vars(_shared_module(_os.environ[_ENV])).items() if not k.startswith("__")})
