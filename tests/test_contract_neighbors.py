"""The neighbours document (``<prefix>/neighbors/<host>``, retained) reads what it writes, built
from what lldpcli printed, and a malformed one is one `DocumentError` line."""

from __future__ import annotations

import pytest

from contract.jsondoc import DocumentError
from contract.neighbors import LldpNeighbor, NeighborsDoc, NicNeighbors
from contract.topics import Topics
from prober.discover.lldp import parse_lldp
from tests.lldprecord import LLDP_JSON0


def test_round_trip_from_lldpcli_output() -> None:
    seen = parse_lldp(LLDP_JSON0)["va"]
    doc = NeighborsDoc("host0", 7, (NicNeighbors("nic0", "va", "10.0.0.1", seen),
                                    NicNeighbors("nic1", "vb", "10.0.0.2")))  # fmt: skip
    back = NeighborsDoc.decode(doc.encode())
    assert back == doc and back.nics[0].neighbors[0].name == "leaf0"
    assert NeighborsDoc.decode(b"") == NeighborsDoc("")  # a cleared retained message
    assert LldpNeighbor("", "aa:bb").name == "aa:bb"  # no system name: the chassis id
    assert Topics().neighbors("host0") == "qpmesh/v1/neighbors/host0"
    assert Topics().parse("qpmesh/v1/neighbors/host0") == ("neighbors", "host0")
    # keys a newer prober adds are ignored
    assert NeighborsDoc.decode(b'{"host": "h", "nics": [], "new": 1}') == NeighborsDoc("h")


@pytest.mark.parametrize(
    ("payload", "where"),
    [
        (b"[]", "neighbors"),
        (b'{"host": 3}', "neighbors: host"),
        (b'{"host": "h", "nics": [{"nic": "n", "address": "nope"}]}', r"nics\[0\].*address"),
        (b'{"host": "h", "nics": [{"nic": "", "address": "10.0.0.1"}]}', r"nics\[0\].*nic"),
        (b'{"host": "h", "nics": [{"nic": "n", "address": "10.0.0.1", "neighbors": [{}]}]}',
         r"neighbors\[0\].*chassis_name"),
        (b'{"host": "h", "nics": [{"nic": "n", "address": "10.0.0.1", "neighbors": [{"chassis_name": "x", "mgmt": [1]}]}]}',
         "mgmt"),
        (b'{"host": "h", "nics": [{"nic": "n", "address": "10.0.0.1"}, {"nic": "n", "address": "10.0.0.2"}]}',
         "repeat"),
    ],
)  # fmt: skip
def test_malformed_documents_are_one_line_errors(payload: bytes, where: str) -> None:
    with pytest.raises(DocumentError, match=where) as err:
        NeighborsDoc.decode(payload)
    assert "\n" not in str(err.value)
