"""`cornus txn`'s exit status tells an unknown outcome from an abort (services/cli.py)."""

from __future__ import annotations

import httpx
import pytest

from services import cli
from services.client import CornusClient, Outcome, Status


def _answering(outcome: str) -> type[CornusClient]:
    """A client whose node answers every execute with `outcome`."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/healthz":
            return httpx.Response(200, json={"status": "ok", "node": "n0", "protocol": "cornus"})
        body = {"txn": "1.n0.x.1.cornus", "outcome": outcome, "detail": "as told"}
        if outcome == "aborted":
            body |= {"reason": "conflict", "retryable": False}
        return httpx.Response(200, json=body)

    class Answering(CornusClient):
        def __init__(self, url: str, **kwargs: object) -> None:
            kwargs.pop("http", None)
            super().__init__(url, http=httpx.Client(transport=httpx.MockTransport(handler)), **kwargs)  # type: ignore[arg-type]

    return Answering


@pytest.mark.parametrize(("outcome", "code"), [("committed", 0), ("aborted", 1), ("unknown", cli.EXIT_CODE_UNKNOWN)])
def test_an_unknown_outcome_exits_with_its_own_code(monkeypatch: pytest.MonkeyPatch, outcome: str, code: int) -> None:
    """Found by audit (2026-11-27): unknown exited 1, as an abort does, so a script rerunning
    `cornus txn` until it exits 0 ran a transaction that may have committed again."""
    monkeypatch.setattr(cli, "CornusClient", _answering(outcome))
    assert cli.main(["txn", "--url", "http://node:8100", "put:k=v"]) == code


def test_a_value_read_that_is_not_text_is_printed_as_its_exact_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    """Found by review (2026-11-28): the text output printed `reads` alone, so a value stored
    through gRPC that is not UTF-8 (which the SDK hands back in binary_reads) was left out."""
    outcome = Outcome("1.n0.x.1.cornus", Status.COMMITTED, reads={"t": "text"}, binary_reads={"b": b"\xff\x00a"})
    cli._print_outcome(outcome, as_json=False)
    printed = capsys.readouterr().out
    assert 't = "text"' in printed and "b = (not UTF-8, 3 bytes, base64) /wBh" in printed, printed
