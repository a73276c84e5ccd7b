"""casmoe.sim.passes: the passes that walk a run in time.

- `decide`: the decision pass (one cache's events per step, as replay makes them);
- `timing`: the timing pass (`StepTimer`: what a step's decisions cost on the machine), with
  `timing_kernel` and `compiled_timing` (the same timing compiled);
- `link`: host-to-device `Link` (free-at time, demand ahead of queued prefetches), `HostCap`;
- `tiers`: the host RAM tier over the storage drive (`--host-cache`), chunked two-tier misses;
- `assembly`: the resolved run the driver takes (`Run`), its steps cut into shards (`TraceSteps`), setup and state;
  `driver`: `run_trace`, a run from its start to its result (requests one after another here, served in `serving`);
- `traffic`: how requests reach a served run and how the server batches them (`Traffic`, a run option);
- `serving`: SimPy processes for arrivals, users, the continuous-batching scheduler and devices;
- `timeliness`: per-layer late hits and wasted prefetches, the perfect-prefetch stall bound;
- `latency`: TTFT, TPOT, end-to-end and queue figures; `result`: `SimResult`;
- `timeline`: the Chrome/Perfetto recorder.
"""
