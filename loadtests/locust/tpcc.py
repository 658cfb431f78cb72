"""Locust file: TPC-C NewOrder and Payment (loadtests/workloads/tpcc.py), over a node's REST API.

    locust -f loadtests/locust/tpcc.py --host http://127.0.0.1:18400 --headless -u 8 -r 8 -t 30s --csv out
    CORNUS_WORKLOAD_KNOBS=warehouses=4 locust -f loadtests/locust/tpcc.py --host http://127.0.0.1:18400
        (then Locust's web UI on http://127.0.0.1:8089; add --web-host 127.0.0.1 to keep it on loopback)

Settings and how transactions are reported: loadtests/locust/common.py. The same workload over the
public gRPC API: loadtests/locust/grpc_users.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Locust puts this file's directory on sys.path, not the repository's: a checkout need not be
# installed to run it.
if str(Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from loadtests.locust.common import CornusHttpUser, install_rest_load


class TpccUser(CornusHttpUser):
    workload_name = "tpcc"


install_rest_load("tpcc")
