"""The benchmarks: `cornus bench` (cluster.py, driver.py, http.py, sweep.py, report.py, plots.py,
profiles.py), `cornus termination-bench` (termination.py), `cornus storage-bench` (storage.py) and
the node-to-node transport alone (`python -m loadtests.bench.transport`)."""
