"""What the test modules share: builders of runs and models, the CLI driver, trace helpers,
engine dump writers, the policy variants the compiled suites walk, the source import graph and the
repository's paths. Test modules import it as `support` (pyproject puts `tests/` on the path);
nothing here is collected as a test."""
