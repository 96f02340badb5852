"""`kdabench tune`: the offline generator of profiles (docs/DESIGN.md §9).

For each query of a queries file it times candidate kernel configs on the device in hand,
checks the fastest against the float64 oracle on a smaller instance, and writes
profiles/<device>.json with the measurements behind every choice; the policy catalog
(kdabench.kernels.policy) then resolves plans from it.

Modules: `queries` (the queries file), `grid` (candidate configs and the rule that filters
them), `runner` (timing and the oracle check on a device), `run` (the run and the profile).
"""

from kdabench.tune.grid import RULE, Candidates, candidates
from kdabench.tune.queries import (
    DEFAULT_QUERIES,
    QueriesError,
    TuneQueries,
    TuneQuery,
    load_queries,
    parse_queries,
    select_queries,
)
from kdabench.tune.run import MAX_ORACLE_TRIES, Tune, TuneError, TuneResult
from kdabench.tune.runner import KernelRunner, Runner, Timed, oracle_check, query_inputs

__all__ = [
    "DEFAULT_QUERIES", "MAX_ORACLE_TRIES", "RULE", "Candidates", "KernelRunner", "QueriesError",
    "Runner", "Timed", "Tune", "TuneError", "TuneQueries", "TuneQuery", "TuneResult",
    "candidates", "load_queries", "oracle_check", "parse_queries", "query_inputs",
    "select_queries",
]
