"""TPC-C's NewOrder and Payment, the two transactions the paper's Sundial testbed runs in its
distributed TPC-C (half each by default, `payment_perc`), over a key-value schema, with the number
of warehouses as the contention knob (every Payment updates its warehouse's year-to-date total,
every NewOrder its district's next order id).

Placement: warehouse w and everything under it (districts, customers, stock, orders, order lines,
new-orders, history) live on partition w mod P, so warehouses are partitioned over the nodes; the
read-only item table is replicated on every partition, as Sundial does. Remote work, per the TPC-C
specification: each order line is supplied by another warehouse with probability 1%
(`remote_line_perc`), and 15% of payments are for a customer of another warehouse
(`remote_payment_perc`); those transactions are distributed when the other warehouse is on another
partition.

Both run as interactive transactions (read, then write what the reads decided, then commit):
NewOrder must read its district's next order id to name the order it inserts. Scaled down so a
load over the API takes seconds: `items` items (100,000 in the specification), `customers`
customers per district (3,000), no initial orders, customers and items chosen uniformly (not by
NURand), no 1% rollback of NewOrder, customers chosen by id only. Amounts are integers in cents.

The end-of-run check is TPC-C's consistency condition 1 (a warehouse's year-to-date total is the
sum of its districts') and its analogue of condition 2 for our counts: each district's next order
id is one past the NewOrders committed there, the last order exists and the next one does not.
"""

from __future__ import annotations

import collections
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
    Write,
    knob_float,
    knob_int,
    read_in_batches,
    refuse_unknown,
)

DISTRICTS_PER_WAREHOUSE = 10
WAREHOUSES_MAX = 256
ITEMS = 1_000
ITEMS_MAX = 100_000
CUSTOMERS = 30
CUSTOMERS_MAX = 3_000
ORDER_LINES_MIN = 5
ORDER_LINES_MAX = 15
QUANTITY_MAX = 10
PAYMENT_CENTS_MAX = 500_000
WAREHOUSE_YTD_START = 30_000_000  # 300,000.00
DISTRICT_YTD_START = WAREHOUSE_YTD_START // DISTRICTS_PER_WAREHOUSE
KNOBS = {"warehouses", "items", "customers", "payment_perc", "remote_line_perc", "remote_payment_perc"}


def _fields(value: str | None, count: int, key: str) -> list[int]:
    if value is None:
        raise RuntimeError(f"tpcc: {key} was read as absent; was the data loaded?")
    parts = value.split("|")
    if len(parts) != count:
        raise RuntimeError(f"tpcc: {key} holds {value!r}, not {count} fields")
    return [int(part) for part in parts]


def _join(*fields: int) -> str:
    return "|".join(str(field) for field in fields)


class TpccWorkload(Workload):
    name = "tpcc"

    def __init__(self, partition_count: int, knobs: Mapping[str, object] | None = None) -> None:
        super().__init__(partition_count)
        knobs = dict(knobs or {})
        refuse_unknown(knobs, KNOBS, self.name)
        self.warehouses = knob_int(knobs, "warehouses", partition_count, 1, WAREHOUSES_MAX)
        self.items = knob_int(knobs, "items", ITEMS, ORDER_LINES_MAX, ITEMS_MAX)
        self.customers = knob_int(knobs, "customers", CUSTOMERS, 1, CUSTOMERS_MAX)
        self.payment_perc = knob_float(knobs, "payment_perc", 50.0, 0.0, 100.0)
        self.remote_line_perc = knob_float(knobs, "remote_line_perc", 1.0, 0.0, 100.0)
        self.remote_payment_perc = knob_float(knobs, "remote_payment_perc", 15.0, 0.0, 100.0)
        # Committed work as the clients were told it, for the end-of-run check.
        self.new_orders: collections.Counter[tuple[int, int]] = collections.Counter()
        self.paid_cents: collections.Counter[int] = collections.Counter()
        self.unknown_outcomes = 0

    # === schema ===================================================================================

    def part(self, warehouse: int) -> int:
        return warehouse % self.partition_count

    def _key(self, row: str, warehouse: int) -> str:
        return self.pinner.key(row, self.part(warehouse))

    def warehouse_key(self, w: int) -> str:
        return self._key(f"w{w}", w)

    def district_key(self, w: int, d: int) -> str:
        return self._key(f"d{w}.{d}", w)

    def customer_key(self, w: int, d: int, c: int) -> str:
        return self._key(f"c{w}.{d}.{c}", w)

    def stock_key(self, w: int, i: int) -> str:
        return self._key(f"s{w}.{i}", w)

    def item_key(self, partition: int, i: int) -> str:
        return self.pinner.key(f"i{i}", partition)

    def order_key(self, w: int, d: int, o: int) -> str:
        return self._key(f"o{w}.{d}.{o}", w)

    def data_size(self) -> DataSize:
        per_warehouse = 1 + DISTRICTS_PER_WAREHOUSE * (1 + self.customers) + self.items
        return DataSize(self.items * self.partition_count + self.warehouses * per_warehouse,
                        f"{self.items:,} items x {self.partition_count} partitions + {self.warehouses} warehouses x "
                        f"(1 + {DISTRICTS_PER_WAREHOUSE} districts x (1 + {self.customers:,} customers) + "
                        f"{self.items:,} stock)")

    def initial_data(self) -> dict[str, str]:
        rng = random.Random(0)
        data: dict[str, str] = {}
        for partition in range(self.partition_count):
            for i in range(self.items):
                data[self.item_key(partition, i)] = str(100 + (i * 7919) % 9_900)  # a price in cents
        for w in range(self.warehouses):
            data[self.warehouse_key(w)] = _join(WAREHOUSE_YTD_START, rng.randrange(2_001))
            for d in range(DISTRICTS_PER_WAREHOUSE):
                data[self.district_key(w, d)] = _join(DISTRICT_YTD_START, rng.randrange(2_001), 1)
                for c in range(self.customers):
                    # balance -10.00, ytd payment 10.00, one payment, a discount in basis points
                    data[self.customer_key(w, d, c)] = _join(-1_000, 1_000, 1, rng.randrange(5_001))
            for i in range(self.items):
                data[self.stock_key(w, i)] = _join(rng.randint(10, 100), 0, 0, 0)
        return data

    # === transactions =============================================================================

    def _other_warehouse(self, rng: random.Random, w: int) -> int:
        return (w + rng.randrange(1, self.warehouses)) % self.warehouses

    def next_txn(self, rng: random.Random, client: int) -> Txn:
        w = client % self.warehouses
        d = rng.randrange(DISTRICTS_PER_WAREHOUSE)
        if rng.random() * 100 < self.payment_perc:
            c_w, c_d = w, d
            if self.warehouses > 1 and rng.random() * 100 < self.remote_payment_perc:
                c_w, c_d = self._other_warehouse(rng, w), rng.randrange(DISTRICTS_PER_WAREHOUSE)
            c = rng.randrange(self.customers)
            amount = rng.randint(100, PAYMENT_CENTS_MAX)
            serial = rng.getrandbits(48)
            return Txn(kind="payment", home=f"p{self.part(w)}",
                       partitions=frozenset({f"p{self.part(w)}", f"p{self.part(c_w)}"}), read_only=False,
                       program=lambda: self._payment(w, d, (c_w, c_d, c), amount, f"{client}.{serial}"))
        c = rng.randrange(self.customers)
        lines: list[tuple[int, int, int]] = []  # (item, supplying warehouse, quantity)
        for item in rng.sample(range(self.items), rng.randint(ORDER_LINES_MIN, ORDER_LINES_MAX)):
            supply = w
            if self.warehouses > 1 and rng.random() * 100 < self.remote_line_perc:
                supply = self._other_warehouse(rng, w)
            lines.append((item, supply, rng.randint(1, QUANTITY_MAX)))
        return Txn(kind="new_order", home=f"p{self.part(w)}",
                   partitions=frozenset({f"p{self.part(w)}"} | {f"p{self.part(s)}" for _, s, _ in lines}),
                   read_only=False, program=lambda: self._new_order(w, d, c, lines))

    def _new_order(self, w: int, d: int, c: int, lines: list[tuple[int, int, int]]) -> Program:
        home = self.part(w)
        w_key, d_key, c_key = self.warehouse_key(w), self.district_key(w, d), self.customer_key(w, d, c)
        item_keys = [self.item_key(home, item) for item, _, _ in lines]
        stock_keys = [self.stock_key(supply, item) for item, supply, _ in lines]
        reply = yield Read((w_key, d_key, c_key, *item_keys, *stock_keys))
        values = reply.values
        _, w_tax = _fields(values.get(w_key), 2, w_key)
        d_ytd, d_tax, o_id = _fields(values.get(d_key), 3, d_key)
        discount = _fields(values.get(c_key), 4, c_key)[3]
        all_local = int(all(supply == w for _, supply, _ in lines))
        writes: dict[str, str | None] = {
            d_key: _join(d_ytd, d_tax, o_id + 1),
            self.order_key(w, d, o_id): _join(c, len(lines), all_local),
            self._key(f"no{w}.{d}.{o_id}", w): "1",
        }
        for number, ((item, supply, quantity), item_key, stock_key) in enumerate(
                zip(lines, item_keys, stock_keys, strict=True)):
            price = int(values.get(item_key) or 0)
            stock_quantity, ytd, order_count, remote_count = _fields(values.get(stock_key), 4, stock_key)
            # TPC-C 2.4.2.2: restock by 91 when fewer than 10 would be left.
            stock_quantity -= quantity
            if stock_quantity < 10:
                stock_quantity += 91
            writes[stock_key] = _join(stock_quantity, ytd + quantity, order_count + 1,
                                      remote_count + int(supply != w))
            amount = quantity * price * (10_000 + w_tax + d_tax) * (10_000 - discount) // 10_000 ** 2
            writes[self._key(f"ol{w}.{d}.{o_id}.{number}", w)] = _join(item, supply, quantity, amount)
        yield Write(writes)
        reply = yield Commit()
        if reply.committed:
            self.new_orders[(w, d)] += 1
        elif reply.outcome == "unknown":
            self.unknown_outcomes += 1

    def _payment(self, w: int, d: int, customer: tuple[int, int, int], amount: int, serial: str) -> Program:
        c_w, c_d, c = customer
        w_key, d_key, c_key = self.warehouse_key(w), self.district_key(w, d), self.customer_key(c_w, c_d, c)
        reply = yield Read((w_key, d_key, c_key))
        values = reply.values
        w_ytd, w_tax = _fields(values.get(w_key), 2, w_key)
        d_ytd, d_tax, o_id = _fields(values.get(d_key), 3, d_key)
        balance, ytd_payment, payments, discount = _fields(values.get(c_key), 4, c_key)
        yield Write({
            w_key: _join(w_ytd + amount, w_tax),
            d_key: _join(d_ytd + amount, d_tax, o_id),
            c_key: _join(balance - amount, ytd_payment + amount, payments + 1, discount),
            self._key(f"h{w}.{d}.{serial}", w): _join(c_w, c_d, c, amount),
        })
        reply = yield Commit()
        if reply.committed:
            self.paid_cents[w] += amount
        elif reply.outcome == "unknown":
            self.unknown_outcomes += 1

    # === end-of-run check =========================================================================

    def check(self, read: Callable[[Sequence[str]], dict[str, str | None]]) -> list[str]:
        keys = [self.warehouse_key(w) for w in range(self.warehouses)] + [
            self.district_key(w, d) for w in range(self.warehouses) for d in range(DISTRICTS_PER_WAREHOUSE)]
        values = read_in_batches(read, keys)
        violations: list[str] = []
        last_orders: list[tuple[int, int, int]] = []
        for w in range(self.warehouses):
            w_ytd = _fields(values.get(self.warehouse_key(w)), 2, self.warehouse_key(w))[0]
            districts = [_fields(values.get(self.district_key(w, d)), 3, self.district_key(w, d))
                         for d in range(DISTRICTS_PER_WAREHOUSE)]
            if w_ytd != sum(district[0] for district in districts):
                violations.append(f"warehouse {w}: W_YTD {w_ytd} is not the sum of its districts' D_YTD "
                                  f"{sum(district[0] for district in districts)} (TPC-C consistency condition 1)")
            exact = self.unknown_outcomes == 0
            if exact and w_ytd - WAREHOUSE_YTD_START != self.paid_cents[w]:
                violations.append(f"warehouse {w}: W_YTD grew by {w_ytd - WAREHOUSE_YTD_START}, the committed "
                                  f"payments add up to {self.paid_cents[w]}")
            for d, (_, _, next_order) in enumerate(districts):
                if exact and next_order - 1 != self.new_orders[(w, d)]:
                    violations.append(f"district {w}.{d}: next order id {next_order}, but "
                                      f"{self.new_orders[(w, d)]} NewOrders committed there")
                last_orders.append((w, d, next_order))
        orders = read_in_batches(read, [self.order_key(w, d, o) for w, d, next_order in last_orders
                                        for o in ((next_order - 1, next_order) if next_order > 1 else (next_order,))])
        for w, d, next_order in last_orders:
            if next_order > 1 and orders.get(self.order_key(w, d, next_order - 1)) is None:
                violations.append(f"district {w}.{d}: order {next_order - 1} is missing")
            if orders.get(self.order_key(w, d, next_order)) is not None:
                violations.append(f"district {w}.{d}: order {next_order} exists beyond the next order id")
        return violations

    def describe(self) -> dict[str, Any]:
        return {"warehouses": self.warehouses, "items": self.items, "customers": self.customers,
                "payment_perc": self.payment_perc, "remote_line_perc": self.remote_line_perc,
                "remote_payment_perc": self.remote_payment_perc}
