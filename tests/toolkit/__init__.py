"""The one toolkit of the tests, the chaos suite and the benchmarks (`bench/`).

- `procs`: real `python -m jobq ...` (or `python -m bench.bare`) subprocesses: their
  environment, starting and stopping them, waiting on them (`eventually`, `registered`,
  `http_ready`), a free port, and `python -m jobq check`.
- `database`: a fresh, migrated database per test session or benchmark run, dropped at the end.
- `handlers`: the recording handler (`recorded`), which writes each execution to the
  `execution` table; worker subprocesses import it through `JOBQ_JOB_MODULES`.
- `receiver`: a real webhook receiver (keep-alive HTTP/1.1) that records every request and
  every reminder delivery, checking signatures independently of jobq's code.
- `served`: the app served in this process by hypercorn, for what only a real client sends.
- `postgres`: a PostgreSQL server of one's own (the chaos suite's, which it restarts and
  crashes), started from the `pgserver` wheel's programs the way `jobq.embedded` starts the
  embedded server (`jobq.embedded.programs`), so it runs wherever `make test` does.

It lives in `tests/` rather than in a top-level package: the tests and the benchmarks both run
from a checkout (neither ships in the wheel), `tests/` is already on every tool's path (pytest,
ruff, mypy), and `bench` imports `tests.toolkit` as the chaos suite imports `bench`'s load
generator. Only what both sides need, or what one side needs in more than one place, is here.
"""
