"""casmoe.sim: the SimPy model of PCIe/GPU timing driven by routing traces."""
