"""Hardware prices (`casmoe.sim.box.prices`): the shipped file with a source per number, a box priced
from its GPUs, RAM and link, a user's override file, and prices that are unknown, never guessed."""

from __future__ import annotations

import pytest

from casmoe.sim.box.hardware import load_profile
from casmoe.sim.box.prices import PRICES_FILE, PriceError, link_generation, load_prices, ram_generation


def test_every_shipped_price_has_a_source_and_proxies_say_so():
    prices = load_prices()
    entries = [*prices.gpu.values(), *prices.ram.values(), *prices.link.values()]
    assert len(prices.gpu) >= 9 and set(prices.ram) == {"ddr4", "ddr5"} and set(prices.link) == {"pcie3", "pcie4", "pcie5"}
    assert all(p.source.strip() and p.usd >= 0 for p in entries)
    assert prices.link["pcie4"].caveat == prices.link["pcie5"].caveat == "proxy"
    assert prices.gpu["NVIDIA H100 SXM5 80GB"].caveat == "street price, low end"
    assert prices.gpu["NVIDIA GeForce RTX 4090"].caveat == ""


def test_a_box_is_its_gpus_its_ram_and_its_link():
    prices = load_prices()
    box = prices.box(load_profile("rtx4090x4"))
    assert box.usd == pytest.approx(4 * 1599 + 256 * 6.25 + 100)
    assert "4 x NVIDIA GeForce RTX 4090 $6,396" in box.breakdown() and "proxy: pcie4 host link" in box.describe()
    one = prices.box(load_profile("rtx4090x4@gpus=1,link=pcie5,host_ram_gib=64"))
    assert one.usd == pytest.approx(1599 + 64 * 6.25 + 100 + 134.99)
    assert prices.box(load_profile("rtx4090x4@link=pcie3")).usd == pytest.approx(4 * 1599 + 256 * 6.25)
    assert prices.box(load_profile("rtx5090")).usd == pytest.approx(1999 + 128 * 7.03 + 234.99)


@pytest.mark.parametrize("name, ram, link", [("rtx4090x4", "ddr4", "pcie4"), ("rtx5090", "ddr5", "pcie5"),
                                             ("h100-sxm", "ddr5", "pcie5"), ("a100-80g", "ddr4", "pcie4"),
                                             ("rtx4090x4@link=pcie3", "ddr4", "pcie3"),
                                             ("rtx5090@link=pcie4", "ddr5", "pcie4")])
def test_the_ram_and_link_generation_come_from_the_profile(name, ram, link):
    hw = load_profile(name)
    assert (ram_generation(hw), link_generation(hw)) == (ram, link)


def _copied(tmp_path, **changes):
    text = (PRICES_FILE.parent / "profiles" / "rtx4090x4.toml").read_text()
    for key, value in changes.items():
        text = "\n".join(f"{key} = {value}" if ln.startswith(f"{key} =") else ln for ln in text.splitlines()) + "\n"
    (tmp_path / "box.toml").write_text(text)
    return load_profile(tmp_path / "box.toml")


def test_a_gpu_without_a_price_is_unknown_not_invented(tmp_path):
    hw = _copied(tmp_path, gpu='"Some Future GPU"')
    box = load_prices().box(hw)
    assert box.usd is None and not box.known
    assert box.describe().startswith("unknown (no price for GPU 'Some Future GPU'; add [gpu.\"Some Future GPU\"]")


def test_a_users_file_overrides_entry_by_entry_and_adds(tmp_path):
    (tmp_path / "p.toml").write_bytes(("\ufeff" + '[gpu."NVIDIA GeForce RTX 4090"]\nusd = 1800\nsource = "my shop, 2026"\n'
                                       '[gpu."Some Future GPU"]\nusd = 5000\nsource = "a quote"\n'
                                       '[ram.ddr4]\nusd_per_gib = 3\nsource = "used DIMMs"\n').encode())
    prices = load_prices(tmp_path / "p.toml")
    assert prices.gpu["NVIDIA GeForce RTX 4090"].usd == 1800 and prices.ram["ddr5"].usd == load_prices().ram["ddr5"].usd
    assert prices.box(load_profile("rtx4090x4")).usd == pytest.approx(4 * 1800 + 256 * 3 + 100)
    assert prices.box(_copied(tmp_path, gpu='"Some Future GPU"')).usd == pytest.approx(4 * 5000 + 256 * 3 + 100)
    assert prices.files == ("casmoe/sim/box/prices.toml", str(tmp_path / "p.toml"))


@pytest.mark.parametrize("text, says", [
    ('[gpu."X"]\nusd = 10\n', "no source for usd"),
    ('[gpu."X"]\nusd = 10\nsource = ""\n', "no source for usd"),
    ('[gpu."X"]\nusd = nan\nsource = "s"\n', "finite number >= 0"),
    ('[gpu."X"]\nusd = -1\nsource = "s"\n', "finite number >= 0"),
    ('[gpu."X"]\nusd = "1599"\nsource = "s"\n', "finite number >= 0"),
    ('[gpu."X"]\nusd = true\nsource = "s"\n', "finite number >= 0"),
    ('[gpu."X"]\nprice = 10\nsource = "s"\n', "unknown key 'price'"),
    ('[ram.ddr3]\nusd_per_gib = 1\nsource = "s"\n', "ram.ddr4 or ram.ddr5"),
    ('[link.pcie6]\nusd = 1\nsource = "s"\n', "pcie3, pcie4, pcie5"),
    ('[cpu."X"]\nusd = 1\nsource = "s"\n', "unknown table 'cpu'"),
    ('gpu = 5\n', "must be a table"),
    ('[gpu]\nX = 5\n', "must be a table with usd"),
    ('[gpu."X"\n', "not valid TOML"),
])
def test_a_bad_prices_file_is_one_line_naming_it(tmp_path, text, says):
    (tmp_path / "p.toml").write_text(text)
    with pytest.raises(PriceError, match=says) as info:
        load_prices(tmp_path / "p.toml")
    assert "p.toml" in str(info.value) and "\n" not in str(info.value)


def test_a_missing_prices_file_is_one_line(tmp_path):
    with pytest.raises(PriceError, match="not found"):
        load_prices(tmp_path / "none.toml")
