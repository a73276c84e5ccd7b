"""casmoe.sim.run: a run, described once.

- `options`: every run option declared once (type, default, help, whether it is a grid axis);
- `grid`: `Grid`, run-option values (from the CLI or a TOML), and the one function building runs;
- `spec`: `RunSpec`, one simulation with every value parsed, keyed by the content it depends on;
- `fits`: capacities, devices and host RAM checked against the profile (`--allow-overcommit`);
- `runner`: running one `RunSpec` (`run`) or many into a folder keeping their results (`run_all`);
- `runtimes`: the headline's methods priced again on the stacks of the runtimes that run them.
"""
