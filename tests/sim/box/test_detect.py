"""The box detector on recorded outputs of real machines (tests/data/detect/, each folder's README
names its source) and, once, on the machine the tests run on."""

from __future__ import annotations

import json
import sys
import types

import pytest
from support.cli import assert_one_line, cli
from support.paths import DATA

from casmoe.sim.box.bandwidth import stream_copy
from casmoe.sim.box.detect import Detected, detect, detect_profile
from casmoe.sim.box.hardware import GPU_FIELDS, HardwareProfile, load_profile
from casmoe.sim.box.parts import cpu_entry, cpu_key
from casmoe.sim.box.reader import RecordedReader, SystemReader

BOXES = DATA / "detect"


def recorded(box: str) -> Detected:
    return detect(RecordedReader(BOXES / box))


def how(found: Detected, field: str) -> str:
    return found.provenance[field]


@pytest.mark.parametrize("box", sorted(p.name for p in BOXES.iterdir() if p.is_dir()))
def test_every_number_says_how_it_was_obtained_and_the_written_profile_loads_back(box, tmp_path):
    found = recorded(box)
    p = found.profile
    assert set(p.sources) == set(HardwareProfile.numeric_fields())
    assert all(s.split(":")[0] in ("detected", "measured", "assumed") for s in p.sources.values()), p.sources
    assert not any(h == "measured" for h in found.provenance.values())  # a recorded box is not this machine
    again = load_profile(p.write(tmp_path / f"{box}.toml"))
    assert again == p and again.sources == p.sources
    assert (BOXES / box / "README.md").read_text().strip()


def test_nvidia_gpu_with_its_pcie_generation_and_width():
    found = recorded("h100-sxm")
    p = found.profile
    assert (p.gpus, p.gpu) == (1, "NVIDIA H100 80GB HBM3")
    assert p.memory_gib == pytest.approx(81559 / 1024)
    assert (p.dense_tflops, p.mem_bw_gbs, p.h2d_pinned_gbs) == (989.4, 3350.0, 56.0)  # catalog; links.toml pcie5
    assert {how(found, f) for f in ("gpus", "memory_gib", "dense_tflops", "mem_bw_gbs", "h2d_pinned_gbs")} == {"detected"}
    assert found.facts["GPU link"].value == "PCIe 5.0 x16"
    assert how(found, "h2d_pageable_gbs") == how(found, "reserved_gib") == "assumed"


def test_eight_gpus_of_one_kind():
    p = recorded("h200x8").profile
    assert (p.gpus, p.gpu, p.mem_bw_gbs) == (8, "NVIDIA H200", 4800.0)
    assert p.memory_gib == pytest.approx(143771 / 1024)


def test_a_gpu_not_in_the_catalog_takes_the_nearest_entry_and_says_so():
    found = recorded("rtx2080super")
    p = found.profile
    assert p.h2d_pinned_gbs == 12.0 and how(found, "h2d_pinned_gbs") == "detected"  # gen 3: the GPU's, not the host's 4
    assert p.mem_bw_gbs == 448.0 and how(found, "mem_bw_gbs") == "assumed"
    assert "not in catalog gpus.toml; the entry nearest by name, 'NVIDIA GeForce RTX 2080'" in p.sources["mem_bw_gbs"]
    assert how(found, "dense_tflops") == "assumed" and "has no bf16_tflops" in p.sources["dense_tflops"]


def test_amd_gpu_from_rocm_smi():
    found = recorded("rx7900xt")
    p = found.profile
    assert (p.gpus, p.gpu, p.mem_bw_gbs) == (1, "AMD Radeon RX 7900 XT", 800.0)
    assert p.memory_gib == pytest.approx(21458059264 / 2**30) and how(found, "memory_gib") == "detected"
    assert p.h2d_pinned_gbs == 24.0 and "the link was not read" in p.sources["h2d_pinned_gbs"]  # catalog '4.0 x16'
    assert how(found, "dense_tflops") == "assumed"  # the catalog found no RDNA 3 matrix rate


def test_dual_socket_server_with_eight_numa_nodes():
    found = recorded("dual-epyc-7451")
    p = found.profile
    assert (p.cpu_sockets, p.cpu_cores, p.gpus) == (2, 48, 0)
    assert p.cpu == "2x AMD EPYC 7451 24-Core Processor (48 cores, AVX2, FMA)"
    assert found.facts["NUMA nodes"].value == 8
    assert found.facts["NUMA nodes"].source.count("12 CPUs") == 8  # from each node's cpumap
    assert p.cpu_tflops == pytest.approx(48 * 32 * 2.3 / 1000, abs=1e-3)  # lscpu 'CPU max MHz: 2300'
    assert how(found, "cpu_tflops") == "assumed" and "CPU max MHz: 2300" in p.sources["cpu_tflops"]
    assert p.cpu_serial == 1.0  # no GPU: the host runs every expert


def test_desktop_ddr5_channels_and_speed_from_dmidecode():
    found = recorded("desktop-z790-ddr5")
    assert found.profile.cpu_mem_bw_gbs == 76.8 and how(found, "cpu_mem_bw_gbs") == "detected"  # 2 x 8 B x 4800
    assert found.facts["memory"].value == "DDR5-4800, 2 modules on 2 channels"


def test_server_with_few_slots_populated_counts_its_channels():
    found = recorded("server-2x-gold6330")
    assert found.profile.cpu_mem_bw_gbs == 140.8  # 6 channels x 8 B x 2933 MT/s, not the sockets' 16
    assert "P0_Node0_Channel0" not in found.profile.sources["cpu_mem_bw_gbs"]
    assert found.facts["memory"].value == "DDR4-2933, 6 modules on 6 channels"


def test_dmidecode_unreadable_without_root_is_assumed_and_says_why():
    found = recorded("apple-vm-nonroot")
    p = found.profile
    assert how(found, "cpu_mem_bw_gbs") == "assumed"
    assert "Permission denied" in p.sources["cpu_mem_bw_gbs"] and "it needs root" in p.sources["cpu_mem_bw_gbs"]
    assert (p.cpu_cores, p.cpu_tflops) == (4, 4 * 16 * 2.0 / 1000)  # NEON, no clock read: the stated default
    assert "NEON" in p.sources["cpu_tflops"] and "clock not read" in p.sources["cpu_tflops"]


def test_cpu_only_vm_recorded_here():
    found = recorded("kvm-xeon-2vcpu")
    p = found.profile
    assert (p.gpus, p.host_ram_gib, p.cpu_cores) == (0, 23.59, 2)  # MemTotal: 24731400 kB
    assert all(getattr(p, f) == 0 for f in GPU_FIELDS) and p.sources["gpus"].startswith("detected: no GPU")
    assert "AMX" in found.facts["ISA"].value and "AMX read in the flags" in p.sources["cpu_matrix_speedup"]
    assert "/dev/mem: No such file or directory" in found.facts["memory"].source
    assert p.host_reserved_gib == 4.0 and how(found, "host_reserved_gib") == "assumed"


@pytest.mark.parametrize("box, speedup, how_read, words", [
    ("kvm-xeon-2vcpu", 4.0, "detected", "avx512_vnni and avx_vnni; 4: AVX512-VNNI / AVX-VNNI vpdpbusd"),  # AMX Xeon
    ("dual-epyc-7451", 2.0, "detected", "avx2 without VNNI; 2: without VNNI"),  # Zen 1: AVX2, no VNNI
    ("apple-vm-nonroot", 0.0, "assumed", "neither VNNI nor AVX2"),  # NEON
    ("h100-sxm", 0.0, "assumed", "flags not read"),
])
def test_the_int8_dot_product_speedup_is_read_from_the_flags(box, speedup, how_read, words):
    found = recorded(box)
    assert found.profile.cpu_int8_speedup == speedup and how(found, "cpu_int8_speedup") == how_read
    assert words in found.profile.sources["cpu_int8_speedup"]
    if speedup == 4.0:
        assert "AVX-512 VNNI" in found.facts["ISA"].value and "int8 dot products x4" in found.profile.describe_host()


def test_without_flags_the_int8_dot_product_comes_from_the_catalog_entry():
    from casmoe.sim.box.detect import _int8_dot
    from casmoe.sim.box.parts import cpu_catalog
    from casmoe.sim.box.readings import Cpu, detected

    for model, speedup in (("Intel(R) Xeon(R) Gold 6330 CPU @ 2.00GHz", 4.0),  # Ice Lake: VNNI
                           ("Intel(R) Xeon(R) Gold 6138 CPU @ 2.00GHz", 2.0),  # Skylake-SP: AVX-512 without VNNI
                           ("AMD EPYC 7453 28-Core Processor", 2.0),  # Zen 3: AVX2
                           ("Intel(R) Core(TM) Ultra 7 265K", 0.0)):  # the catalog does not know
        cpu = Cpu(detected(model, "test"), None, None, None, None, None, None)
        key = cpu_entry(model)
        fact = _int8_dot(cpu, key, cpu_catalog()[key] if key else None)
        assert fact.value == speedup and fact.how == ("detected" if speedup else "assumed"), model
        assert f"catalog '{key}'" in fact.source


def test_a_measured_host_says_how_it_was_measured():
    small = lambda threads, _nbytes: stream_copy(threads, 8 * 2**20)  # a real copy, kept short
    found = detect(RecordedReader(BOXES / "kvm-xeon-2vcpu"), small)
    p = found.profile
    assert how(found, "cpu_thread_gbs") == how(found, "cpu_mem_bw_gbs") == "measured"
    assert p.cpu_thread_gbs > 0 and "numpy copy of 8 MiB by 1 thread" in p.sources["cpu_thread_gbs"]


@pytest.mark.parametrize("model,key", [
    ("Intel(R) Xeon(R) Gold 6330 CPU @ 2.00GHz", "Intel Xeon Gold 6330"),  # server-2x-gold6330's dmidecode
    ("13th Gen Intel(R) Core(TM) i5-13600K", "Intel Core i5-13600K"),  # desktop-z790-ddr5's dmidecode
    ("AMD EPYC 7451 24-Core Processor", "AMD EPYC 7451"),
    ("Intel(R) Xeon(R) Processor", "Intel Xeon"),
])
def test_cpu_names_as_lscpu_prints_them_meet_the_catalog(model, key):
    assert cpu_key(model) == key
    assert (cpu_entry(model) is not None) == (key == "Intel Xeon Gold 6330")


def test_nvml_is_read_before_nvidia_smi(monkeypatch):
    """NVML's answers (nvidia-ml-py stubbed with the h100-sxm capture's values) come first."""
    fake = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    fake.NVMLError = NVMLError
    fake.nvmlInit = fake.nvmlShutdown = lambda: None
    fake.nvmlDeviceGetCount = lambda: 1
    fake.nvmlDeviceGetHandleByIndex = lambda i: i
    fake.nvmlDeviceGetName = lambda h: b"NVIDIA H100 80GB HBM3"
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=81559 * 2**20)
    fake.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 5
    fake.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    nvml = SystemReader().library("nvml")
    assert nvml == [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 81559 * 2**20, "pcie_gen": 5, "pcie_width": 16}]

    class WithNvml(RecordedReader):
        def library(self, name):
            return nvml if name == "nvml" else None

    found = detect(WithNvml(BOXES / "rtx2080super"))  # its nvidia-smi output is not read once NVML answers
    assert (found.profile.gpus, found.profile.gpu, found.profile.h2d_pinned_gbs) == (1, "NVIDIA H100 80GB HBM3", 56.0)
    assert found.profile.sources["gpus"].startswith("detected: NVML")


@pytest.mark.filterwarnings("ignore")
def test_this_machine():
    """Whatever this host is: a profile that loads, each number sourced, the probe measured."""
    found = detect_profile(measure=True)
    p = found.profile
    assert HardwareProfile.from_toml(p.to_toml()) == p
    assert set(found.provenance.values()) <= {"detected", "measured", "assumed"}
    assert how(found, "cpu_thread_gbs") == "measured" and p.cpu_thread_gbs > 0
    assert detect_profile(measure=True) is found  # once a process


def test_cli_writes_a_profile_that_hardware_accepts(tmp_path, monkeypatch, capsys):
    code, out, err = cli(["hardware", "detect", "--from", str(BOXES / "h200x8"), "--out", "box.toml"],
                         tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "read" in out and "assumed" in out and "wrote box.toml" in out
    p = load_profile(tmp_path / "box.toml")
    assert (p.name, p.gpus) == ("box", 8)
    code, out, _ = cli(["hardware", "detect", "--from", str(BOXES / "h200x8"), "--json"], tmp_path, monkeypatch, capsys)
    shown = json.loads(out)
    assert shown["provenance"]["mem_bw_gbs"] == "detected" and shown["facts"]["GPU link"]["value"] == "PCIe 5.0 x16"


def test_cli_errors_are_one_line(tmp_path, monkeypatch, capsys):
    code, _, err = cli(["hardware", "detect", "--from", str(tmp_path / "nowhere")], tmp_path, monkeypatch, capsys)
    assert_one_line(code, err)
    assert "not a folder of recorded outputs" in err
    code, out, _ = cli(["hardware", "detect", "--help"], tmp_path, monkeypatch, capsys)
    assert code == 0 and "--no-measure" in out


@pytest.mark.parametrize("box, speedup, how_read, words", [
    ("kvm-xeon-2vcpu", 2.0, "detected", "avx512_bf16; AVX512_BF16 vdpbf16ps"),  # Sapphire Rapids class
    ("dual-epyc-7451", 0.0, "assumed", "no avx512_bf16 in the flags"),  # Zen 1
    ("h100-sxm", 0.0, "assumed", "flags not read"),
])
def test_the_bf16_dot_product_speedup_is_read_from_the_flags(box, speedup, how_read, words):
    found = recorded(box)
    assert found.profile.cpu_bf16_speedup == speedup and how(found, "cpu_bf16_speedup") == how_read
    assert words in found.profile.sources["cpu_bf16_speedup"]
