"""How the box detector sees a machine: the one place that runs its tools and reads its files.

Every probe of a machine goes through a reader, so that the same parsing runs on the live
machine (`SystemReader`) and on outputs recorded elsewhere (`RecordedReader`: one folder per
box, as `tests/data/detect/` holds them, or a copy of what a user's server printed). A reader
answers None for what it cannot give (a tool not installed, a file absent or unreadable): the
detector then says the number was assumed, and why.

A recorded box is a folder that mirrors the machine: `proc/meminfo`, `sys/devices/system/node/
node0/cpulist`, ... at their paths, and each tool's output (its stdout and stderr, as a user
pastes it) in `commands/NAME`, NAME a key of `COMMANDS`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Protocol

COMMANDS: dict[str, tuple[str, ...]] = {
    "lscpu": ("lscpu",),
    "dmidecode": ("dmidecode", "-t", "memory"),
    "nvidia-smi": ("nvidia-smi", "--query-gpu=name,memory.total,pcie.link.gen.max,pcie.link.width.max",
                   "--format=csv,nounits"),
    "rocm-smi": ("rocm-smi", "--showproductname", "--showmeminfo", "vram", "--showbus", "--json"),
}
"""The tools the detector runs, by the name a recorded box files their output under. nvidia-smi
keeps its CSV header so that columns are read by name (a recorded output with more columns
reads alike); `pcie.link.*.max` is the fastest link the GPU and its slot both support (an idle
GPU drops its current link to generation 1)."""

TIMEOUT_S = 20.0
"""A tool that has not answered by then (a hung driver) is taken as absent."""


def command_line(name: str) -> str:
    """The command a reading came from, as a user would type it (for sources)."""
    return " ".join(COMMANDS[name])


class Reader(Protocol):
    """What the detector asks of a machine."""

    def run(self, name: str) -> str | None:
        """The output of tool `name` (a key of `COMMANDS`), or None when it is not there."""

    def read(self, path: str) -> str | None:
        """The text of the machine's file `path` (absolute, e.g. /proc/meminfo), or None."""

    def listdir(self, path: str) -> list[str]:
        """The names in the machine's folder `path` (empty when absent)."""

    def library(self, name: str) -> Any:
        """What a Python library reads of the machine: 'nvml' (a list of dicts per NVIDIA GPU:
        name, memory_bytes, pcie_gen, pcie_width) or 'psutil' (memory_bytes, cores, threads);
        None when the library or what it reads is not there."""


class _Files:
    """A machine's files under a root: `/` for the live machine, a box's folder when recorded."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _path(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def read(self, path: str) -> str | None:
        try:
            return self._path(path).read_text(errors="replace")
        except OSError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return sorted(os.listdir(self._path(path)))
        except OSError:
            return []


class SystemReader(_Files):
    """The machine this process runs on."""

    def __init__(self) -> None:
        super().__init__(Path("/"))

    def run(self, name: str) -> str | None:
        argv = COMMANDS[name]
        if shutil.which(argv[0]) is None:
            return None
        env = {**os.environ, "LC_ALL": "C"}  # lscpu translates its labels; the parser reads the English ones
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, errors="replace",
                                  check=False)  # a tool that fails says why in its output: the parser reads it
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout + done.stderr

    def library(self, name: str) -> Any:
        return {"nvml": _nvml, "psutil": _psutil}[name]()


class RecordedReader(_Files):
    """A box recorded elsewhere: its folder (see the module docstring). A library's reading is
    `NAME.json` in the folder when it was recorded."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(Path(folder))

    def run(self, name: str) -> str | None:
        return self.read(f"commands/{name}")

    def library(self, name: str) -> Any:
        text = self.read(f"{name}.json")
        return None if text is None else json.loads(text)


def _nvml() -> list[dict[str, Any]] | None:
    """Each NVIDIA GPU as NVML (the driver's own library, through nvidia-ml-py) reports it."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver, no GPU
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append({
                "name": name.decode() if isinstance(name, bytes) else name,
                "memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
                "pcie_gen": pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                "pcie_width": pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle),
            })
        return gpus
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()


def _psutil() -> dict[str, Any] | None:
    """Memory and core counts as psutil reads them: where /proc and lscpu are missing (macOS)."""
    try:
        import psutil
    except ImportError:
        return None
    return {"memory_bytes": psutil.virtual_memory().total, "cores": psutil.cpu_count(logical=False),
            "threads": psutil.cpu_count(logical=True)}
