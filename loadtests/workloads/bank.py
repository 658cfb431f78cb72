"""The bank: `accounts` accounts spread evenly over the partitions, each starting at BALANCE_START.
A transfer reads two accounts and moves a random amount from one to the other (an interactive
transaction: read, write, commit); an audit reads every account in one read-only transaction and
checks that the balances add up to the total. The total never changes, so every committed audit
and the end-of-run check must see exactly it.

The first `audit_clients` clients run audits, the others transfers: with 60 accounts, 6 transfer
clients and one auditor, the audit is the large read-only transaction that strict two-phase
locking under NO_WAIT starves (any transfer holding one of its 60 keys aborts it), the case the
lock policy knob is for. The same invariant is what loadtests/chaos checks under faults.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from loadtests.workloads.base import (
    Commit,
    DataSize,
    Program,
    Read,
    Txn,
    Workload,
    WorkloadError,
    Write,
    knob_int,
    read_in_batches,
    refuse_unknown,
)

BALANCE_START = 100
AMOUNT_MAX = 20
ACCOUNTS = 60
ACCOUNTS_MAX = 100_000
# An audit reads every account in one request; the node refuses more than op_count_max (1000).
AUDIT_ACCOUNTS_MAX = 1_000
AUDIT_CLIENTS_MAX = 64
KNOBS = {"accounts", "audit_clients"}


class BankWorkload(Workload):
    name = "bank"

    def __init__(self, partition_count: int, knobs: Mapping[str, object] | None = None) -> None:
        super().__init__(partition_count)
        knobs = dict(knobs or {})
        refuse_unknown(knobs, KNOBS, self.name)
        self.account_count = knob_int(knobs, "accounts", ACCOUNTS, 2, ACCOUNTS_MAX)
        self.audit_clients = knob_int(knobs, "audit_clients", 0, 0, AUDIT_CLIENTS_MAX)
        if self.audit_clients and self.account_count > AUDIT_ACCOUNTS_MAX:
            raise WorkloadError(f"an audit reads every account in one request: accounts must be at most "
                                f"{AUDIT_ACCOUNTS_MAX} with audit_clients > 0")
        # Account i lives on partition i mod P, as YCSB's rows do.
        self.accounts = [self.pinner.key(f"acct{i}", i % partition_count) for i in range(self.account_count)]
        self.audits_seen = 0
        self.audit_violations: list[str] = []

    @property
    def total(self) -> int:
        return BALANCE_START * self.account_count

    def initial_data(self) -> dict[str, str]:
        return dict.fromkeys(self.accounts, str(BALANCE_START))

    def data_size(self) -> DataSize:
        return DataSize(self.account_count, f"{self.account_count:,} accounts")

    def next_txn(self, rng: random.Random, client: int) -> Txn:
        if client < self.audit_clients:
            return Txn(kind="audit", home=f"p{client % self.partition_count}",
                       partitions=frozenset(f"p{i % self.partition_count}" for i in range(self.account_count)),
                       read_only=True, program=self._audit)
        source, target = rng.sample(range(self.account_count), 2)
        amount = rng.randint(1, AMOUNT_MAX)
        return Txn(kind="transfer", home=f"p{source % self.partition_count}",
                   partitions=frozenset({f"p{source % self.partition_count}", f"p{target % self.partition_count}"}),
                   read_only=False,
                   program=lambda: self._transfer(self.accounts[source], self.accounts[target], amount))

    @staticmethod
    def _transfer(source: str, target: str, amount: int) -> Program:
        reply = yield Read((source, target))
        balances = reply.values
        if balances.get(source) is None or balances.get(target) is None:
            raise RuntimeError(f"bank: an account was read as absent: {balances}")
        yield Write({source: str(int(balances[source]) - amount),  # type: ignore[arg-type]
                     target: str(int(balances[target]) + amount)})  # type: ignore[arg-type]
        yield Commit()

    def _audit(self) -> Program:
        reply = yield Read(tuple(self.accounts))
        balances = reply.values
        reply = yield Commit()
        if reply.committed:
            self.audits_seen += 1
            seen = sum(int(value) for value in balances.values() if value is not None)
            if seen != self.total or len(balances) != self.account_count:
                self.audit_violations.append(f"a committed audit saw a total of {seen}, not {self.total}")

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        balances = read_in_batches(read, self.accounts)
        violations = list(self.audit_violations)
        missing = [key for key in self.accounts if balances.get(key) is None]
        if missing:
            violations.append(f"{len(missing)} accounts vanished, e.g. {missing[:3]}")
        total = sum(int(value) for value in balances.values() if value is not None)
        if total != self.total:
            violations.append(f"the balances add up to {total}, not {self.total}")
        return violations

    def describe(self) -> dict[str, Any]:
        return {"accounts": self.account_count, "audit_clients": self.audit_clients}
