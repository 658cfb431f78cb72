"""Every benchmark and load test of Cornus: the workloads (YCSB, TPC-C, bank) in `workloads`, the
built-in closed-loop driver, sweeps, plots and reports behind `cornus bench` in `bench`, Locust
files in `locust`, and the chaos harness in `chaos`. See loadtests/README.md."""
