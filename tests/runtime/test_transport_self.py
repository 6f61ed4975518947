"""Transport round trips through MPI.COMM_SELF in this process (a rank may message itself)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from mpi4py import MPI

from mpifc.runtime.kinds import register_kind
from mpifc.runtime.ledger import CommLedger
from mpifc.runtime.transport import DeadlineExceeded, Transport
from mpifc.runtime import wire

ARR = register_kind("test.self.array", "model_parameters", "arrays to self")
OBJ = register_kind("test.self.object", "control", "objects to self")

DTYPES = st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int32, np.int8, np.uint8,
                          np.uint64, np.bool_, np.complex64, np.complex128])


def make_transport(**kw) -> Transport:
    return Transport(MPI.COMM_SELF, CommLedger(0, 1), deadline=kw.pop("deadline", 5.0), **kw)


@settings(max_examples=60, deadline=None)
@given(arr=hnp.arrays(DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)),
       inline_max=st.sampled_from([0, 16, 1 << 14]), chunk=st.sampled_from([1, 7, 1 << 20]))
def test_any_array_round_trips_bit_exact(arr, inline_max, chunk):
    tr = make_transport(inline_max=inline_max, chunk_bytes=chunk)
    pending = tr.isend(arr, 0, ARR)
    got = tr.recv(0, ARR)
    pending.wait()
    assert got.dtype == arr.dtype and got.shape == arr.shape
    assert got.tobytes() == arr.tobytes()  # bit-exact, NaNs included
    row = tr.ledger.rows[-1]
    assert row["payload_bytes"] == arr.nbytes
    assert row["header_bytes"] == wire.header_size(arr.ndim)
    inline = arr.nbytes <= inline_max
    assert row["n_mpi_messages"] == (1 if inline else 1 + -(-arr.nbytes // chunk))
    assert tr.ledger.sent[0].tolist() == [1, arr.nbytes, wire.header_size(arr.ndim)]


def test_receive_deadline_names_peer_and_kind():
    tr = make_transport(deadline=0.2)
    with pytest.raises(DeadlineExceeded, match=r"0.2 s passed waiting for a 'test.self.array' message from rank 0"):
        tr.recv(0, ARR)


def test_receive_deadline_without_watchdog_polls_and_raises():
    tr = make_transport(deadline=0.2)
    tr._guard = None  # what a non-THREAD_MULTIPLE MPI gets: polling from Python
    with pytest.raises(DeadlineExceeded, match=r"waiting for a 'test.self.array' message from rank 0"):
        tr.recv(0, ARR)
    p = tr.isend(np.arange(5.0), 0, ARR)
    assert tr.recv(0, ARR).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # still usable for new messages
    p.wait()


def test_multi_kind_wait_polls_backs_off_and_hits_the_deadline():
    tr = make_transport(deadline=0.3)  # > spin_s, so the sleeping back-off runs too
    with pytest.raises(DeadlineExceeded, match=r"a 'test.self.array' or 'test.self.object' message from rank 0"):
        tr.recv_any_kind([ARR, OBJ], sources=[0])


def test_kinds_do_not_mix():
    tr = make_transport()
    p1 = tr.isend(np.arange(4), 0, ARR)
    p2 = tr.isend_obj({"k": 1}, 0, OBJ)
    assert tr.recv_obj(0, OBJ) == {"k": 1}
    assert tr.recv(0, ARR).tolist() == [0, 1, 2, 3]
    p1.wait(); p2.wait()


def test_object_where_array_expected_is_a_type_error():
    tr = make_transport()
    tr.send_obj([1, 2], 0, ARR)
    with pytest.raises(TypeError, match="expected an array, got a pickled object"):
        tr.recv(0, ARR)
    tr.flush()


def test_unsendable_inputs_are_refused_clearly():
    tr = make_transport()
    with pytest.raises(TypeError, match="dtype object"):
        tr.send(np.array([{}, 1], dtype=object), 0, ARR)
    with pytest.raises(ValueError, match="cannot send to rank 3: the job has ranks 0..0"):
        tr.send(np.zeros(2), 3, ARR)
    with pytest.raises(ValueError, match="cannot receive from rank -1"):
        tr.recv(-1, ARR)


def test_try_recv_and_recv_any():
    tr = make_transport()
    assert tr.try_recv(0, ARR) == (False, None)
    tr.send(np.ones(3), 0, ARR)
    ok, value = tr.try_recv(0, ARR)
    assert ok and value.tolist() == [1.0, 1.0, 1.0]
    tr.send_obj("hi", 0, OBJ)
    assert tr.recv_any(OBJ) == (0, "hi")
    tr.send(np.zeros(1), 0, ARR)
    src, kind, value = tr.recv_any_kind([OBJ, ARR], sources=[0])
    assert (src, kind.name, value.tolist()) == (0, "test.self.array", [0.0])
    tr.flush()


def test_send_hooks_see_every_send_path_and_instance_isend_wrappers_still_apply():
    tr = make_transport()
    seen = []
    tr.send_hooks.append(lambda kind, dest, arr, is_pickle: seen.append((kind.name, dest, arr.nbytes, is_pickle)))
    tr.send(np.zeros(2), 0, ARR)                 # to self: the isend path
    tr.send_obj("x", 0, OBJ)
    p = tr.isend(np.zeros(5000), 0, ARR)        # non-blocking, chunk path
    for _ in range(3):
        tr.recv_any_kind([ARR, OBJ])
    p.wait()
    assert [(n, d, p_) for n, d, _, p_ in seen] == [("test.self.array", 0, False), ("test.self.object", 0, True),
                                                  ("test.self.array", 0, False)]
    assert seen[0][2] == 16 and seen[2][2] == 40000
    wrapped = []
    orig = tr.isend
    tr.isend = lambda x, dest, kind: (wrapped.append(dest), orig(x, dest, kind))[1]
    tr.send(np.ones(1), 0, ARR)
    assert wrapped == [0] and tr.recv(0, ARR).tolist() == [1.0]
    tr.flush()


def test_recv_into_out_and_mismatched_out_is_refused():
    tr = make_transport(inline_max=64)
    out = np.empty((4, 5), np.float32)
    src = np.arange(20, dtype=np.float32).reshape(4, 5)
    p = tr.isend(src, 0, ARR)
    got = tr.recv(0, ARR, out=out)
    p.wait()
    assert got is out and np.array_equal(out, src)
    p = tr.isend(np.arange(3.0), 0, ARR)
    with pytest.raises(ValueError, match=r"float64\[3\]; out= is float32\[4, 5\]"):
        tr.recv(0, ARR, out=out)
    p.wait()


def test_large_receives_recycle_buffers_without_aliasing():
    tr = make_transport()
    arrays = []
    for i in range(3):
        p = tr.isend(np.full(1 << 18, i, dtype=np.float64), 0, ARR)  # 2 MiB each
        arrays.append(tr.recv(0, ARR))
        p.wait()
    assert [float(a[0]) for a in arrays] == [0.0, 1.0, 2.0]  # all held: no reuse, no aliasing
    del arrays
    p = tr.isend(np.full(1 << 18, 7.0), 0, ARR)
    again = tr.recv(0, ARR)
    p.wait()
    assert tr.pool.reused >= 1 and float(again.sum()) == 7.0 * (1 << 18)


def test_long_wait_goes_soft_then_still_receives():
    # The watchdog cancels MPI's busy wait after spin_s; the receive is posted again and the
    # message that comes later still arrives (nothing lost, nothing received twice).
    import threading
    import time as _time

    tr = make_transport(deadline=5.0, spin_s=0.01)
    other = make_transport(deadline=5.0)
    timer = threading.Timer(0.3, lambda: other.isend(np.arange(4.0), 0, ARR).wait())
    timer.start()
    t0 = _time.perf_counter()
    got = tr.recv(0, ARR)
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0] and _time.perf_counter() - t0 >= 0.25
    timer.join()
    assert tr.try_recv(0, ARR) == (False, None)


# --- recv(out=): header and payload receives posted together (the pre-posted path) -------------

def test_preposted_out_round_trips_and_ledger_counts_the_bytes():
    tr = make_transport(inline_max=64)
    for dtype, shape in [(np.float64, (4, 5)), (np.int8, (100,)), (np.complex64, (3, 2, 2)), (np.bool_, (65,))]:
        src = (np.arange(int(np.prod(shape))) % 7).astype(dtype).reshape(shape)
        out = np.empty(shape, dtype)
        p = tr.isend(src, 0, ARR)
        got = tr.recv(0, ARR, out=out)
        p.wait()
        assert got is out and out.tobytes() == src.tobytes()
        row = tr.ledger.rows[-1]
        assert (row["payload_bytes"], row["header_bytes"], row["n_mpi_messages"]) == \
            (src.nbytes, wire.header_size(src.ndim), 2)


def test_recv_out_fast_dispatch_keeps_flags_and_source_types():
    # recv(out=) goes straight to the pre-posted path for a large out= and an int source; a
    # bfloat16 message (its uint16 bits fill out=) still comes back as float32 values, and a
    # numpy-integer source takes the general path to the same result.
    torch = pytest.importorskip("torch")
    tr = make_transport(inline_max=64)
    vals = torch.arange(40, dtype=torch.float32).to(torch.bfloat16)
    out = np.empty(40, np.uint16)
    p = tr.isend(vals, 0, ARR)
    got = tr.recv(0, ARR, out=out)
    p.wait()
    assert got.dtype == np.float32 and got.tolist() == list(range(40))
    assert out.tobytes() == vals.view(torch.int16).numpy().tobytes()
    src = np.arange(40, dtype=np.float64)
    p = tr.isend(src, 0, ARR)
    out64 = np.empty(40)
    assert tr.recv(np.int64(0), ARR, out=out64) is out64 and out64.tolist() == src.tolist()
    p.wait()


def test_preposted_out_with_inline_mismatch_is_refused_and_the_stream_goes_on():
    tr = make_transport(inline_max=64)
    out = np.empty(100, np.float64)
    p = tr.isend(np.arange(3.0), 0, ARR)  # inline: the early payload receive must be cancelled
    with pytest.raises(ValueError, match=r"from rank 0 is float64\[3\]; out= is float64\[100\]$"):
        tr.recv(0, ARR, out=out)
    p.wait()
    p = tr.isend(np.arange(100.0), 0, ARR)
    assert tr.recv(0, ARR, out=out) is out and out.tolist() == list(range(100))
    p.wait()


def test_preposted_out_that_took_the_next_message_says_so():
    tr = make_transport(inline_max=64)
    p1 = tr.isend(np.arange(3.0), 0, ARR)     # wrong (inline) message, then one more: by the time
    p2 = tr.isend(np.arange(5.0), 0, ARR)     # the header is seen, the payload receive matched p2
    with pytest.raises(ValueError, match=r"float64\[3\]; out= is float64\[100\]; the receive posted into out= "
                                         r"had already taken the following MPI message from rank 0 \(80 bytes\)"):
        tr.recv(0, ARR, out=np.empty(100, np.float64))
    p1.wait(); p2.wait()


def test_preposted_out_same_shape_but_inline_falls_back():
    # A sender with a larger inline_max sends inline what this rank expects as a payload message.
    tr = make_transport(inline_max=1024)
    sender = make_transport(inline_max=1280)
    src = np.arange(150.0)  # 1200 bytes: inline for the sender, pre-posted for the receiver
    p = sender.isend(src, 0, ARR)
    out = np.empty(150)
    assert tr.recv(0, ARR, out=out) is out and np.array_equal(out, src)
    p.wait()
    assert tr.ledger.rows[-1]["n_mpi_messages"] == 1


def test_preposted_out_long_wait_goes_soft_then_still_receives_into_out():
    # recv(out=)'s inlined header wait: past spin_s the watchdog cancels both posted receives; the
    # header is posted again and polled, and the late message still lands whole in out= (nothing
    # lost, nothing received twice, one ledger row with the message's bytes).
    import threading
    import time as _time

    tr = make_transport(inline_max=64, deadline=5.0, spin_s=0.01)
    other = make_transport(inline_max=64, deadline=5.0)
    timer = threading.Timer(0.3, lambda: other.isend(np.arange(50.0), 0, ARR).wait())
    timer.start()
    out = np.zeros(50)
    t0 = _time.perf_counter()
    assert tr.recv(0, ARR, out=out) is out and out.tolist() == list(range(50))
    assert _time.perf_counter() - t0 >= 0.25
    timer.join()
    row = tr.ledger.rows[-1]
    assert len(tr.ledger) == 1 and row["payload_bytes"] == 400 and row["n_mpi_messages"] == 2
    assert tr.try_recv(0, ARR) == (False, None)


@pytest.mark.parametrize("spin_s", [0.01, 5.0])  # soft limit first, or the hard deadline with both posted
def test_preposted_out_deadline_names_peer_and_kind_and_cancels_both(spin_s):
    tr = make_transport(inline_max=64, deadline=0.3, spin_s=spin_s)
    out = np.zeros(50)
    with pytest.raises(DeadlineExceeded, match=r"0.3 s passed waiting for a 'test.self.array' message from rank 0"):
        tr.recv(0, ARR, out=out)
    # Nothing is left posted: the next message arrives whole in a fresh receive, out= untouched.
    p = tr.isend(np.arange(50.0), 0, ARR)
    assert tr.recv(0, ARR).tolist() == list(range(50)) and not out.any()
    p.wait()


def test_preposted_payload_receive_cancelled_by_a_late_soft_limit_is_posted_again():
    # The watchdog's soft-limit cancel can race with the header's arrival and hit the payload
    # receive after the header wait returned: the payload must still arrive (no false deadline).
    tr = make_transport(inline_max=64)
    out = np.zeros(40)
    req = tr.comm.Irecv([tr._hbuf, len(tr._hbuf), MPI.BYTE], 0, ARR.kind_id)
    pre = tr.comm.Irecv([out, out.nbytes, MPI.BYTE], 0, ARR.kind_id)
    pre.Cancel()  # what the late soft-limit cancel does
    p = tr.isend(np.arange(40.0), 0, ARR)
    req.Wait(tr._status)
    got, _ = tr._take_payload(tr._status.Get_count(MPI.BYTE), 0, ARR, out, pre)
    p.wait()
    assert got is out and out.tolist() == list(range(40))
    assert tr.ledger.rows[-1]["payload_bytes"] == 320


@pytest.mark.parametrize("sent, expected, inline_max", [
    (20, 10, 64),     # payload longer than out=: the early receive truncates it (consumed all the same)
    (10, 20, 64),     # payload shorter than out=: the early receive takes it whole
    (20, 5, 64),      # out= inline-sized (no early receive): the payload is received and dropped
    (3000, 10, 64),   # ... in 7 chunks
])
def test_wrong_size_out_is_refused_and_the_message_is_dropped_so_the_stream_goes_on(sent, expected, inline_max):
    tr = make_transport(inline_max=inline_max, chunk_bytes=4096)
    p = tr.isend(np.arange(float(sent)), 0, ARR)
    with pytest.raises(ValueError, match=rf"float64\[{sent}\]; out= is float64\[{expected}\] "
                                         rf"\(the message was received and dropped\)$"):
        tr.recv(0, ARR, out=np.empty(expected))
    p.wait()
    p = tr.isend(np.arange(float(expected)), 0, ARR)  # the next message arrives whole
    out = np.empty(expected)
    assert tr.recv(0, ARR, out=out) is out and out.tolist() == list(range(expected))
    p.wait()
    assert tr.try_recv(0, ARR) == (False, None)


def test_preposted_out_expected_header_ignores_only_the_send_time():
    # recv(out=) compares the arriving header with the one expected for out= (all bytes but the
    # send time): a message that differs in anything else (here: a pickle of the right length)
    # goes through the general path and is refused there.
    import pickle

    tr = make_transport(inline_max=64)
    obj = list(range(40))
    out = np.zeros(len(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)), np.uint8)
    p = tr.isend_obj(obj, 0, ARR)
    with pytest.raises(TypeError, match="expected an array, got a pickled object"):
        tr.recv(0, ARR, out=out)
    p.wait()
    for i in range(3):  # same layout again and again: the cached expected header, fresh send times
        src = np.full(out.shape, i, np.uint8)
        p = tr.isend(src, 0, ARR)
        assert tr.recv(0, ARR, out=out) is out and (out == i).all()
        p.wait()
        row = tr.ledger.rows[-1]
        assert (row["payload_bytes"], row["header_bytes"], row["n_mpi_messages"]) == (out.nbytes, 40, 2)
        assert row["t_send"] <= row["t_recv"]


def test_preposted_out_of_a_dtype_the_wire_cannot_carry_is_refused_clearly():
    tr = make_transport(inline_max=64)
    p = tr.isend(np.arange(20.0), 0, ARR)
    with pytest.raises(ValueError, match=r"is float64\[20\]; out= is >f8\[20\]"):
        tr.recv(0, ARR, out=np.zeros(20, dtype=">f8"))
    p.wait()


def test_preposted_out_fast_path_reposts_a_payload_receive_cancelled_by_a_late_soft_limit():
    # As above, on the hot path of recv(out=): the header is the expected one, but the early
    # payload receive was cancelled (before the payload came): it is posted again, no false error.
    import threading

    class CancelSecondIrecv:  # the transport's comm, except that its 2nd Irecv gets cancelled
        def __init__(self, comm):
            self._comm, self.n = comm, 0

        def __getattr__(self, name):
            return getattr(self._comm, name)

        def Irecv(self, buf, source, tag):
            req = self._comm.Irecv(buf, source, tag)
            self.n += 1
            if self.n == 2:
                req.Cancel()
            return req

    tr = make_transport(inline_max=64)
    raw = tr.comm
    tr.comm = CancelSecondIrecv(raw)
    src = np.arange(40.0)
    hdr = bytearray(wire.header_size(1))
    wire.pack_header(hdr, wire.DTYPE_CODES[src.dtype], src.shape, 0, ARR.kind_id, 1, 0.0, src.nbytes)
    reqs = [raw.Isend([hdr, len(hdr), MPI.BYTE], 0, ARR.kind_id)]
    timer = threading.Timer(0.2, lambda: reqs.append(raw.Isend([src, src.nbytes, MPI.BYTE], 0, ARR.kind_id)))
    timer.start()
    out = np.zeros(40)
    assert tr.recv(0, ARR, out=out) is out and out.tolist() == list(range(40))
    timer.join()
    MPI.Request.Waitall(reqs)
    assert tr.comm.n == 3 and tr.ledger.rows[-1]["payload_bytes"] == 320


def test_preposted_out_meeting_a_chunked_message_that_it_partly_took_is_refused_and_dropped():
    # A sender with smaller chunk_bytes: the early payload receive takes the first chunk before the
    # header is read. The rest is received and dropped; the next message arrives whole.
    tr = make_transport(inline_max=64)
    sender = make_transport(inline_max=64, chunk_bytes=100)
    p = sender.isend(np.arange(50.0), 0, ARR)  # 400 bytes: 4 chunks
    with pytest.raises(ValueError, match=r"a 4-chunk message where out= expected one payload message .*"
                                         r"\(the message was received and dropped\)$"):
        tr.recv(0, ARR, out=np.empty(50))
    p.wait()
    p = tr.isend(np.arange(50.0), 0, ARR)
    assert tr.recv(0, ARR, out=np.empty(50)).tolist() == list(range(50))
    p.wait()
    assert tr.try_recv(0, ARR) == (False, None)


def test_preposted_payload_that_never_comes_is_a_deadline_naming_the_payload():
    # A header that describes out= exactly, and no payload message after it: the receive into
    # out= must not wait past the deadline, and the error names the payload and its size.
    tr = make_transport(inline_max=64, deadline=0.3)
    out = np.zeros(50)
    header = bytearray(wire.header_size(1))
    n = wire.pack_header(header, wire.DTYPE_CODES[out.dtype], out.shape, 0, ARR.kind_id, 1, 0.0, out.nbytes)
    req = tr.comm.Isend([header, n, MPI.BYTE], 0, ARR.kind_id)
    with pytest.raises(DeadlineExceeded, match=r"0.3 s passed waiting for the payload of a 'test.self.array' "
                                               r"message \(400 bytes\) from rank 0"):
        tr.recv(0, ARR, out=out)
    req.Wait()
    # The cancelled payload receive took nothing: the next message arrives whole.
    p = tr.isend(np.arange(50.0), 0, ARR)
    assert tr.recv(0, ARR, out=out) is out and out.tolist() == list(range(50))
    p.wait()
