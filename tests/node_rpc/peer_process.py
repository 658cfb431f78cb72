"""A node for the transport tests, run as its own OS process: `python -m tests.node_rpc.peer_process`.

It echoes every one-way message back to its sender over its own outbound stream and answers
requests with values the tests can check. Request txn ids steer it: "sleep:<ms>" sleeps first,
"raise" makes the handler fail, "ask:<node>" makes it request <node> in turn. It prints
"READY <port>" once serving and exits when its stdin closes, so a dying test leaves no orphan.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from cornus.protocol.messages import Message
from cornus.runtime.wire import (
    ExecuteRequest,
    ExecuteResponse,
    ExecuteStatus,
    OpKind,
    PeerRequest,
    PeerResponse,
    StatusRequest,
    StatusResponse,
)
from services.node_rpc.transport import PeerTransport
from storage_adapters.contract import TxnState

NESTED_TIMEOUT_MS = 5_000


class EchoHandler:
    def __init__(self, transport: PeerTransport) -> None:
        self.transport = transport
        self.message_count = 0

    def on_message(self, sender: str, message: Message) -> None:
        self.message_count += 1
        self.transport.send(sender, message)

    async def on_request(self, sender: str, request: PeerRequest) -> PeerResponse:
        node_id = self.transport.node_id
        if isinstance(request, StatusRequest):
            return StatusResponse(
                node=node_id,
                ready=True,
                partitions=(f"p-{node_id}",),
                txn_states=((f"p-{node_id}", TxnState.COMMIT),) if request.txn else (),
                in_doubt_count=self.message_count,
            )
        assert isinstance(request, ExecuteRequest)
        txn = request.txn
        if txn.startswith("sleep:"):
            await asyncio.sleep(int(txn.removeprefix("sleep:")) / 1000)
        elif txn == "raise":
            raise RuntimeError("handler asked to fail")
        elif txn.startswith("ask:"):
            nested = await self.transport.request(txn.removeprefix("ask:"), StatusRequest(), NESTED_TIMEOUT_MS)
            assert isinstance(nested, StatusResponse)
            return ExecuteResponse(status=ExecuteStatus.OK, detail=f"{node_id} asked {nested.node}")
        values = tuple(op.value for op in request.ops if op.kind is OpKind.GET)
        return ExecuteResponse(status=ExecuteStatus.OK, values=values, detail=f"{node_id} from {sender}")


async def serve(node_id: str, listen: str, peers: dict[str, str]) -> None:
    transport = PeerTransport(node_id, listen, peers)
    await transport.start(EchoHandler(transport))
    print(f"READY {transport.bound_port}", flush=True)
    loop = asyncio.get_running_loop()
    # Exit when the parent closes our stdin (or dies), never outliving the test.
    await loop.run_in_executor(None, sys.stdin.read)
    await transport.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--peer", action="append", default=[], help="node_id=host:port")
    args = parser.parse_args()
    peers = dict(item.split("=", 1) for item in args.peer)
    asyncio.run(serve(args.node_id, args.listen, peers))


if __name__ == "__main__":
    main()
