"""jobq under faults: clients that record every operation (history), a nemesis that injects faults into
real processes, databases and networks (system, network, patroni, autofailover), and a checker that holds
the whole history and the database's final state to jobq's promises (checker). `make chaos` runs it
(chaos/run.py); docs/explanations/faults.md gives the scenarios and the last results."""
