"""Unit tests of the secure-sum machines, driven by fedproto's synchronous harness (no I/O).

Run from this directory: ``python -m pytest test_secure_sum.py -q``.
"""

import numpy as np
import pytest

from fedproto import InsufficientParticipants, PhaseTimedOut, RemoteProtocolError, decode_frame
from fedproto.testing import Harness
from secure_sum import CLIENTS, ROSTER, SERVER, MaskedInput, link_bytes, make_machines

SECRET = bytes(range(32))
VALUES = {"client-0": np.array([5, -7, 11, 2**40]), "client-1": np.array([100, 200, -300, 3])}


def test_every_party_ends_with_the_sum():
    results = Harness(make_machines(VALUES, SECRET)).run()
    expected = VALUES["client-0"] + VALUES["client-1"]
    for party in ROSTER:
        np.testing.assert_array_equal(results[party], expected)


def test_an_upload_hides_its_input_but_the_uploads_sum_to_the_total():
    harness = Harness(make_machines(VALUES, SECRET))
    harness.start()  # the clients' start() queues their uploads; nothing is delivered yet
    uploads = {frame.sender: decode_frame(frame.data)[1].values for frame in harness.queue}
    assert set(uploads) == set(CLIENTS)
    for client in CLIENTS:
        assert not np.array_equal(uploads[client].view(np.int64), VALUES[client])
    np.testing.assert_array_equal(
        (uploads["client-0"] + uploads["client-1"]).view(np.int64), VALUES["client-0"] + VALUES["client-1"]
    )


def test_bytes_per_link_are_one_encoded_frame_each_way():
    harness = Harness(make_machines(VALUES, SECRET), session=7)
    harness.run()
    report = harness.meter.report(protocol="secure-sum", transport="harness", session=7, parties=ROSTER)
    assert report.bytes_by_link() == link_bytes(d=4, session=7)
    assert report.messages == 4 and report.communication_rounds == 2


def test_a_silent_client_is_named_when_the_deadline_passes():
    machines = make_machines(VALUES, SECRET)
    harness = Harness(machines, tamper=lambda frame: None if frame.sender == "client-1" else frame.data)
    harness.start()
    while harness.deliver_one() is not None:
        pass
    assert machines[SERVER].pending() == ["client-1"]
    with pytest.raises(InsufficientParticipants) as caught:
        harness.inject(SERVER, PhaseTimedOut(round_idx=0, phase="collect", deadline_s=60.0))
    assert caught.value.missing == ("client-1",)
    assert machines[SERVER].failed


def test_input_from_outside_the_client_list_is_refused():
    server = make_machines(VALUES, SECRET)[SERVER]
    server.start()
    with pytest.raises(RemoteProtocolError, match="mallory is not a client"):
        server.receive("mallory", MaskedInput(values=np.zeros(4, dtype=np.uint64)))
    assert server.failed
