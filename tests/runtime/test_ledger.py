"""CommLedger and LedgerTable in one process: growth, phase remapping, CSV and summary sums."""
from __future__ import annotations

import csv
import io

import numpy as np

from mpifc.runtime.kinds import register_kind
from mpifc.runtime.ledger import CommLedger, LedgerTable

K1 = register_kind("test.ledgerunit.one", "likelihood_vector", "one")
K2 = register_kind("test.ledgerunit.two", "control", "two")


def test_growth_keeps_every_row():
    led = CommLedger(rank=1, size=3, capacity=2)
    for i in range(37):
        led.record(K1.kind_id, src=i % 3, payload_bytes=i, header_bytes=32, n_mpi_messages=1, t_send=i, t_recv=i + 0.5)
    assert len(led) == 37
    assert led.rows["payload_bytes"].tolist() == list(range(37))
    assert set(led.rows["dst"].tolist()) == {1}


def test_phases_are_remapped_when_ranks_named_them_in_different_orders(tmp_path):
    a, b = CommLedger(0, 2), CommLedger(1, 2)
    a.set_phase("upward"); a.record(K1.kind_id, 1, 100, 40, 1, 1.0, 2.0)
    a.set_phase("downward"); a.record(K2.kind_id, 1, 7, 32, 1, 3.0, 4.0)
    b.set_phase("downward"); b.record(K2.kind_id, 0, 5, 32, 1, 5.0, 6.0)
    b.set_phase("upward"); b.record(K1.kind_id, 0, 300, 40, 2, 0.5, 0.7)
    a.count_sent(1, 300, 40); a.count_sent(1, 5, 32)
    b.count_sent(0, 100, 40); b.count_sent(0, 7, 32)
    table = LedgerTable.from_parts([(a.rows, a.phase_names, a.sent, 0), (b.rows, b.phase_names, b.sent, 1)])
    rows = list(csv.DictReader(io.StringIO(table.to_csv_text())))
    assert [(r["phase"], r["kind"], r["src"], r["dst"], r["payload_bytes"]) for r in rows] == [
        ("upward", "test.ledgerunit.one", "0", "1", "300"),   # sorted by t_recv
        ("upward", "test.ledgerunit.one", "1", "0", "100"),
        ("downward", "test.ledgerunit.two", "1", "0", "7"),
        ("downward", "test.ledgerunit.two", "0", "1", "5"),
    ]
    assert rows[0]["payload_class"] == "likelihood_vector" and rows[0]["total_bytes"] == "340"
    s = table.summary()
    assert {(d["src"], d["dst"]): d["total_bytes"] for d in s.per_link} == {(0, 1): 340 + 37, (1, 0): 140 + 39}
    assert {d["phase"]: d["messages"] for d in s.per_phase} == {"upward": 2, "downward": 2}
    assert s.unreceived == []
    out = table.write_csv(tmp_path / "sub" / "ledger.csv")
    assert out.read_text() == table.to_csv_text()
    assert not list((tmp_path / "sub").glob(".*tmp"))  # atomic write left no temp file


def test_unreceived_messages_are_reported():
    a, b = CommLedger(0, 2), CommLedger(1, 2)
    a.count_sent(1, 10, 32); a.count_sent(1, 10, 32)
    b.record(K1.kind_id, 0, 10, 32, 1, 0.0, 1.0)
    table = LedgerTable.from_parts([(a.rows, a.phase_names, a.sent, 0), (b.rows, b.phase_names, b.sent, 1)])
    assert table.summary().unreceived == [{"src": 0, "dst": 1, "sent": 2, "received": 1}]
    assert "warning: rank 0 sent 2 messages to rank 1, which received 1" in table.summary().to_table()


def test_empty_table_writes_header_only():
    led = CommLedger(0, 1)
    text = led.local_table().to_csv_text()
    assert text.splitlines() == [",".join(("phase", "kind", "payload_class", "src", "dst", "payload_bytes",
                                           "header_bytes", "total_bytes", "n_mpi_messages", "t_send", "t_recv",
                                           "latency_s"))]
    assert np.all(led.sent == 0)


def test_local_write_csv_and_summary(tmp_path):
    led = CommLedger(rank=2, size=3)
    led.set_phase("p1")
    led.record(K1.kind_id, 0, 80, 40, 1, 1.0, 1.5)
    led.record(K1.kind_id, 1, 20, 40, 1, 1.0, 1.6)
    path = led.write_csv(tmp_path / "l.csv")
    rows = list(csv.DictReader(path.open()))
    assert [(r["phase"], r["src"], r["dst"], r["total_bytes"]) for r in rows] == [("p1", "0", "2", "120"),
                                                                                   ("p1", "1", "2", "60")]
    assert led.summary().per_phase == [{"phase": "p1", "messages": 2, "payload_bytes": 100, "header_bytes": 80,
                                        "total_bytes": 180}]
