"""Hardware profiles: every number sourced, TOML round trip, clear errors."""

from __future__ import annotations

import re

import pytest

from casmoe.sim.box.hardware import HardwareError, HardwareProfile, load_profile, profile_paths
from support.paths import REPO


@pytest.mark.parametrize("name", sorted(profile_paths()))
def test_shipped_profiles_round_trip_with_a_source_per_number(name):
    p = load_profile(name)
    assert p.name == name
    assert set(p.sources) == set(HardwareProfile.numeric_fields())
    again = HardwareProfile.from_toml(p.to_toml())
    assert again == p and again.sources == p.sources


def test_seed_box_numbers():
    p = load_profile("rtx4090x4")
    assert (p.gpus, p.memory_gib, p.h2d_pinned_gbs, p.h2d_pageable_gbs) == (4, 24.0, 24.0, 13.0)
    assert p.dense_tflops == pytest.approx(165.2) and p.mem_bw_gbs == 1008.0


def test_user_profile_from_path_and_calibrated_values(tmp_path):
    measured = load_profile("rtx5090").with_values(
        name="my-box", h2d_pinned_gbs=41.5, sources={"h2d_pinned_gbs": "casmoe calibrate, 2026-11-29"}
    )
    path = measured.write(tmp_path / "my-box.toml")
    loaded = load_profile(str(path))
    assert loaded.h2d_pinned_gbs == 41.5 and loaded.sources["h2d_pinned_gbs"].startswith("casmoe calibrate")


def test_unsourced_number_is_rejected(tmp_path):
    text = load_profile("a100-80g").to_toml().replace('copy_latency_us = "', 'copy_latency_uz = "')
    with pytest.raises(HardwareError, match="no source given for copy_latency_us"):
        HardwareProfile.from_toml(text)


@pytest.mark.parametrize(
    "edit,message",
    [
        (("gpus = 1", "gpus = 0"), "gpus = 0 \\(no GPU\\), but memory_gib, reserved_gib"),
        (("gpus = 1", "gpus = -1"), "gpus must be >= 0"),
        (("mem_efficiency = 0.85", "mem_efficiency = 1.5"), "mem_efficiency must be in"),
        (("gpus = 1", 'gpus = "one"'), "gpus must be int"),
        (("gpus = 1", "gpus = 1\nflux = 2"), "unknown profile fields"),
    ],
)
def test_invalid_profiles(edit, message):
    text = load_profile("a100-80g").to_toml().replace(*edit)
    with pytest.raises(HardwareError, match=message):
        HardwareProfile.from_toml(text)


def test_unknown_name_and_missing_file():
    with pytest.raises(HardwareError, match="shipped: "):
        load_profile("tpu-v9")
    with pytest.raises(HardwareError, match="not found"):
        load_profile("/nonexistent/box.toml")


def test_storage_ram_and_host_cost_are_optional_in_a_file_but_sourced_when_given():
    full = load_profile("a100-80g").to_toml()
    optional = ("storage_read_gbs", "storage_latency_us", "host_ram_gib", "load_host_us", "load_layer_us", "wake_us",
                "resume_per_stall", "copy_beside_us", "decide_us", "decide_load_us", "cpu_hop_us", "expert_pass_us",
                "cpu_serial")
    older = "\n".join(line for line in full.splitlines() if not line.startswith(optional))
    p = HardwareProfile.from_toml(older)
    assert all(getattr(p, n) == 0.0 and "not given" in p.sources[n] for n in optional)
    unsourced = "\n".join(line for line in full.splitlines() if not line.startswith('storage_read_gbs = "'))
    with pytest.raises(HardwareError, match="no source given for storage_read_gbs"):
        HardwareProfile.from_toml(unsourced)


def test_every_shipped_profile_has_a_storage_tier_and_host_ram():
    for name in profile_paths():
        p = load_profile(name)
        assert p.storage_read_gbs > 0 and p.storage_latency_us > 0 and p.host_ram_gib > 0, name


@pytest.mark.parametrize("field", ["h2d_pinned_gbs", "mem_bw_gbs", "cpu_mem_bw_gbs", "memory_gib"])
def test_a_number_no_real_box_has_is_refused_naming_the_fastest(field):
    import dataclasses

    from casmoe.sim.box.hardware import FASTEST_REAL, WHAT_IF

    hw = load_profile("rtx4090x4")
    fastest = FASTEST_REAL[field][0]
    dataclasses.replace(hw, **{field: WHAT_IF * fastest})  # a next generation's what-if is taken
    with pytest.raises(HardwareError, match=f"{field} = .* is beyond any real box .*check the number and its unit"):
        dataclasses.replace(hw, **{field: WHAT_IF * fastest * 1.01})


def test_the_probe_box_of_24000_gbs_of_pcie_is_refused(tmp_path):
    text = load_profile("rtx4090x4").to_toml()
    path = tmp_path / "fast.toml"
    path.write_text("\n".join("h2d_pinned_gbs = 24000.0" if line.startswith("h2d_pinned_gbs =") else line
                              for line in text.splitlines()))
    with pytest.raises(HardwareError, match="h2d_pinned_gbs = 24000 is beyond any real box"):
        load_profile(str(path))


def test_a_box_without_a_gpu_loads_with_its_gpu_fields_zero():
    """A CPU-only box (llama.cpp without a GPU) is a profile with gpus = 0 and every GPU number 0."""
    import dataclasses

    from casmoe.sim.box.hardware import GPU_FIELDS

    hw = load_profile("rtx4090x4")
    none = {n: 0.0 for n in GPU_FIELDS}
    cpu_only = dataclasses.replace(hw, gpus=0, gpu="none", **none,
                                   sources={**hw.sources, **{n: "no GPU" for n in ("gpus", *GPU_FIELDS)}})
    again = HardwareProfile.from_toml(cpu_only.to_toml())
    assert again == cpu_only and again.gpus == 0 and again.usable_bytes() == 0


def test_every_profile_number_has_a_plausible_range():
    """Every number of a profile is bounded by the fastest real part of its kind, or says why it
    has no such bound: a typo or a wrong unit is refused wherever it is written."""
    from casmoe.sim.box.hardware import FASTEST_REAL, UNBOUNDED, HardwareProfile

    fields = set(HardwareProfile.numeric_fields())
    assert fields == set(FASTEST_REAL) | set(UNBOUNDED) and not set(FASTEST_REAL) & set(UNBOUNDED)


@pytest.mark.parametrize("field, value", [("cpu_matrix_speedup", 800.0), ("cpu_int8_speedup", 20.0), ("gpus", 1000),
                                          ("cpu_cores", 10000), ("host_ram_gib", 2e6), ("cpu_thread_gbs", 5000.0)])
def test_a_number_beyond_any_real_part_is_refused(field, value):
    from casmoe.sim.box.hardware import HardwareError, load_profile

    base = load_profile("rtx4090x4")
    extra = {"cpu_cores": 64} if field == "cpu_thread_gbs" else {}
    with pytest.raises(HardwareError, match=f"{field}"):
        base.with_values(**{field: value}, **extra, sources={field: "test", **{k: "test" for k in extra}})


SOCKETS_SAID = re.compile(r"(?:^|\s)(\d)x (?:Intel|AMD)|x (\d) sockets")
"""How a profile's words count its sockets: `2x Intel Xeon Gold 6330` in `cpu`, `... x 2 sockets` in a source."""


@pytest.mark.parametrize("path", [*profile_paths().values(), *sorted((REPO / "examples").glob("*4090*.toml")),
                                  *sorted((REPO / "casmoe" / "sim" / "trust" / "published" / "profiles").glob("*.toml"))],
                         ids=lambda p: p.stem)
def test_a_profile_that_says_its_sockets_declares_them(path):
    """Host weights kept once are read at one socket's bandwidth unless the runtime keeps a copy per
    socket (`--numa`): a dual-socket box whose profile leaves `cpu_sockets` out is priced, and
    `--numa` ignored, as if it had one (the shipped rtx4090x4, h100-sxm and h200-sxm once did)."""
    p = load_profile(path)
    if "one socket of it" in p.cpu:  # a run that used one socket of a dual box
        assert p.sockets == 1
        return
    said = {int(n) for text in (p.cpu, *p.sources.values()) for m in SOCKETS_SAID.findall(text) for n in m if n}
    assert said <= {p.sockets}, f"{path.name}: its words say {sorted(said)} sockets, cpu_sockets gives {p.sockets}"


def test_sockets_are_the_profiles_or_the_count_its_cpu_text_leads_with():
    """One definition for the simulator's NUMA pricing and the plan's NUMA flags: a user's profile that
    writes '2x Intel ...' without cpu_sockets is a dual-socket host to both."""
    text = load_profile("rtx4090x4").to_toml()
    unstated = "\n".join(line for line in text.splitlines() if not line.startswith("cpu_sockets"))
    p = HardwareProfile.from_toml(unstated)
    assert p.cpu_sockets == 0 and p.sockets == 2
    assert HardwareProfile.from_toml(unstated.replace('cpu = "2x ', 'cpu = "')).sockets == 1
    with pytest.raises(HardwareError, match="counts 6400 sockets, beyond any real box"):
        HardwareProfile.from_toml(unstated.replace('cpu = "2x ', 'cpu = "6400x '))
