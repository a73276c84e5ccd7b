"""casmoe.sim.questions: questions answered with runs.

- `search`: the cheapest configurations meeting a target;
- `leaderboard`: every policy on every workload, scored on requests no fitted part saw;
- `deploy/`: `casmoe plan`: engine commands, memory maps and placements;
- `validation`: the published measurements predicted with stacks fitted on other rows;
- `calibration`: a stack fitted on a user's own measured runs (`casmoe calibrate measured`);
- `measured_files`: those runs read from what engines write (llama-bench json/jsonl/csv/md,
  llama-server logs), each with the run that reproduces it.
"""
