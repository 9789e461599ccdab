"""Interface choice and master ports."""

from __future__ import annotations

import os
import socket

import pytest

from hpctorch.errors import HpctorchError
from hpctorch.host import network
from hpctorch.schedulers import job_port

from .helpers import HSN, LO, MGMT, iface


def test_fabric_beats_default_route_and_peers_beat_plain_ethernet() -> None:
    assert network.choose_interface(None, (LO, MGMT, HSN), (), "mgmt0")[0] is HSN
    eth0, eth1 = iface("eth0", "10.0.0.5/24"), iface("eth1", "198.18.1.5/24")
    chosen, why = network.choose_interface(None, (LO, eth0, eth1), ("198.18.1.9",), "eth0")
    assert chosen is eth1 and "198.18.1.9" in why
    assert network.choose_interface(None, (LO, eth0, eth1), (), "eth1")[0] is eth1


def test_down_interfaces_and_loopback_are_never_chosen() -> None:
    down = iface("hsn0", "198.18.0.9/24", up=False)
    with pytest.raises(HpctorchError, match="no network interface"):
        network.choose_interface(None, (LO, down), (), None)
    with pytest.raises(HpctorchError, match="hsn0"):
        network.choose_interface("hsn0", (LO, down), (), None)


def test_malformed_cidr_is_a_clear_error() -> None:
    with pytest.raises(HpctorchError, match="CIDR"):
        network.choose_interface("10.0.0.0/99", (LO, HSN), (), None)


def test_derived_ports_are_stable_in_range_and_distinct_for_nearby_jobs() -> None:
    ports = {job_port.derive_port(str(job)) for job in range(100000, 101250)}
    assert len(ports) == 1250
    assert all(job_port.PORT_BASE <= p < job_port.PORT_BASE + job_port.PORT_SPAN for p in ports)
    assert job_port.derive_port("123", "0") != job_port.derive_port("123", "1")
    pbs = [job_port.derive_port(f"{job}.pbs01") for job in range(1200, 1300)]
    assert len(set(pbs)) == len(pbs)  # 1234.pbs01 and 1259.pbs01 used to meet
    assert job_port.derive_port("1234[5]") != job_port.derive_port("12345")
    siblings = [job_port.derive_port(f"1234[{index}].pbs01") for index in range(100)]
    assert len(set(siblings)) == len(siblings)
    assert len({job_port.derive_port(f"{job}_{index}") for job in (77, 78) for index in range(50)}) == 100


def test_derived_ports_are_the_same_in_every_process_whatever_the_hash_seed() -> None:
    import subprocess
    import sys

    ids = ["123", "1234.pbs01", "1234[5]", "f2Ab3", "kube-run-7"]
    code = f"from hpctorch.schedulers.job_port import derive_port; print([derive_port(i, '1') for i in {ids!r}])"
    seen = {subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True,
                           text=True, check=True).stdout for seed in ("0", "1", "4242")}
    assert seen == {f"{[job_port.derive_port(i, '1') for i in ids]}\n"}


def test_port_is_free_sees_a_listening_socket() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not network.port_is_free("", port)
    assert network.port_is_free("", port)


def test_this_host_lists_loopback() -> None:
    names = {i.name: i for i in network.list_interfaces()}
    assert any(i.is_loopback and i.address == "127.0.0.1" for i in names.values())


def test_netlink_and_psutil_see_the_same_interfaces() -> None:
    fast = {(i.name, i.ipv4, frozenset(i.ipv6), i.is_up) for i in network._netlink_interfaces()}
    slow = {(i.name, i.ipv4, frozenset(i.ipv6), i.is_up) for i in network._psutil_interfaces()}
    assert fast == slow


def test_the_uid_listening_on_a_port_is_read_from_proc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import os
    import socket

    from hpctorch.host import network

    if not os.path.exists("/proc/net/tcp"):
        pytest.skip("no /proc/net/tcp here")
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert network.listener_uid(port) == os.getuid()
        assert network.holder_line(port) == " (held by a process of your own)"
    assert network.listener_uid(port) is None
    # Another user's listener, as /proc/net/tcp shows it (port 0x4E34 = 20020, uid 4242, state 0A).
    table = tmp_path / "tcp"
    table.write_text("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
                     "   0: 010012C6:4E34 00000000:0000 0A 00000000:00000000 00:00000000 00000000  4242        0 1 1 0 100 0 0 10 0\n")
    assert network.listener_uid(20020, (str(table),)) == 4242
    assert network.listener_uid(20021, (str(table),)) is None
