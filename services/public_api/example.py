"""Call a node's public gRPC API from the command line with the generated stubs (no reflection):
the grpcurl of this repository, and a worked example of a client.

    python -m services.public_api.example --target 127.0.0.1:9100 put alice 100 put bob 200 get alice
    python -m services.public_api.example --target 127.0.0.1:9100 check alice 100 delete bob
    python -m services.public_api.example --target 127.0.0.1:9100 --status TXN

Operations, run as one transaction (Execute): `get KEY`, `put KEY VALUE`, `delete KEY`,
`check KEY VALUE` (the key must hold VALUE) and `absent KEY` (the key must not exist). Values are
sent as UTF-8 bytes. Exit status: 0 committed, 1 aborted or another outcome, 2 bad usage, 3 an
error status from the server.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import grpc

from services.public_api import TXN_METADATA_KEY  # importing it builds the generated code first
from services.public_api._generated import public_pb2 as pb
from services.public_api._generated import public_pb2_grpc

# A caller that sets no deadline can wait forever on a node that is stuck; every call gets one.
TIMEOUT_S_CALL = 15.0

_ARITY = {"get": 1, "delete": 1, "absent": 1, "put": 2, "check": 2}
_KINDS = {"get": pb.OP_KIND_GET, "put": pb.OP_KIND_PUT, "delete": pb.OP_KIND_DELETE, "check": pb.OP_KIND_CHECK,
          "absent": pb.OP_KIND_CHECK}


def parse_ops(words: Sequence[str]) -> list[pb.Op]:
    """`put k v get k` -> the ops of an ExecuteRequest. Raises ValueError naming the bad word."""
    ops: list[pb.Op] = []
    index = 0
    while index < len(words):
        verb = words[index]
        arity = _ARITY.get(verb)
        if arity is None:
            raise ValueError(f"{verb!r} is not an operation ({', '.join(_ARITY)})")
        arguments = words[index + 1 : index + 1 + arity]
        if len(arguments) != arity:
            raise ValueError(f"{verb} needs {arity} argument(s): {verb} KEY{' VALUE' if arity == 2 else ''}")
        op = pb.Op(kind=_KINDS[verb], key=arguments[0])
        if arity == 2:
            op.value = arguments[1].encode("utf-8")
        ops.append(op)
        index += 1 + arity
    return ops


def describe(outcome: pb.TxnOutcome) -> str:
    lines = [f"txn:       {outcome.txn}", f"outcome:   {pb.Outcome.Name(outcome.outcome)}"]
    if outcome.reason != pb.ABORT_REASON_UNSPECIFIED:
        lines.append(f"reason:    {pb.AbortReason.Name(outcome.reason)} (retryable: {outcome.retryable})")
    if outcome.detail:
        lines.append(f"detail:    {outcome.detail}")
    for read in outcome.reads:
        shown = repr(read.value) if read.HasField("value") else "(absent)"
        lines.append(f"read:      {read.key} = {shown}")
    if outcome.timing_ms:
        lines.append("timing_ms: " + ", ".join(f"{k}={v:.2f}" for k, v in sorted(outcome.timing_ms.items())))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.public_api.example", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="HOST:PORT of a node's grpc_api_listen")
    parser.add_argument("--status", metavar="TXN", help="ask the outcome of a transaction instead")
    parser.add_argument("--timeout-s", type=float, default=TIMEOUT_S_CALL, help="the call's deadline")
    parser.add_argument("ops", nargs="*", help="operations: get KEY | put KEY VALUE | delete KEY | ...")
    args = parser.parse_args(argv)
    if bool(args.status) == bool(args.ops):
        parser.error("give either operations or --status TXN")
    try:
        ops = parse_ops(args.ops)
    except ValueError as error:
        parser.error(str(error))
    with grpc.insecure_channel(args.target) as channel:
        stub = public_pb2_grpc.CornusStub(channel)
        try:
            if args.status:
                outcome = stub.Status(pb.TxnRequest(txn=args.status), timeout=args.timeout_s)
            else:
                outcome = stub.Execute(pb.ExecuteRequest(ops=ops), timeout=args.timeout_s)
        except grpc.RpcError as error:
            print(f"error:     {error.code().name}: {error.details()}", file=sys.stderr)  # type: ignore[attr-defined]
            txn = dict(error.initial_metadata() or ()).get(TXN_METADATA_KEY, "")  # type: ignore[attr-defined]
            if txn and error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:  # type: ignore[attr-defined]
                print(f"it may have committed: ask with --status {txn}", file=sys.stderr)
            return 3
    print(describe(outcome))
    return 0 if outcome.outcome == pb.OUTCOME_COMMITTED else 1


if __name__ == "__main__":
    sys.exit(main())
