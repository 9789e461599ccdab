"""Doctor verdicts from hand-built reports: cross-node judgements that need no cluster."""

from __future__ import annotations

from hpctorch.doctor.diagnosis import table, verdicts


def _report(node: int, torch: str = "2.13.0", **extra: object) -> dict:
    base = {
        "node": node, "host": f"n{node}", "iface": "hsn0", "address": f"198.18.0.{node + 1}",
        "interfaces": [{"name": "hsn0", "addresses": [f"198.18.0.{node + 1}/24"], "up": True}],
        "resolves": [f"198.18.0.{node + 1}"], "versions": {"python": "3.11.7", "torch": torch, "hpctorch": "0.1.0"},
        "agreement": {"node": node, "host": f"n{node}", "job": "7", "master": "198.18.0.1:20056", "nnodes": 2,
                      "nproc_per_node": [2, 2], "world_size": 4, "nodes": "n0,n1"},
        "master": {"addr": "198.18.0.1", "port": 20056},
    }
    base.update(extra)
    return base


def test_healthy_reports_have_no_verdict() -> None:
    assert verdicts({0: _report(0), 1: _report(1)}, 2) == []


def test_version_skew_names_each_node() -> None:
    found = verdicts({0: _report(0), 1: _report(1, torch="2.12.1")}, 2)
    assert [v.text for v in found] == ["version skew in torch: node 0 2.13.0, node 1 2.12.1"]
    assert found[0].severity == "fail"


def test_a_missing_node_is_named_with_its_host() -> None:
    found = verdicts({0: _report(0)}, 2, hosts=("n0", "n1"))
    assert found[0].text.startswith("node 1 (n1) never reported")
    assert "(no report)" in table({0: _report(0)}, 2, found)


def test_a_name_resolving_to_loopback_is_a_warning_only() -> None:
    found = verdicts({0: _report(0, resolves=["127.0.1.1"]), 1: _report(1)}, 2)
    assert [(v.severity, v.text.split(":")[0]) for v in found] == [("warn", "node 0 (n0)")]
    assert "127.0.1.1 (loopback)" in found[0].text


def test_nccl_failing_where_gloo_passed_points_at_nccl_settings() -> None:
    gloo = {"ok": True, "error": None, "init_s": 0.1, "world": 2, "bandwidth": []}
    nccl = {"ok": False, "error": "NCCL error: remote process exited or there was a network error"}
    found = verdicts({0: _report(0, gloo=gloo, nccl=nccl), 1: _report(1, gloo=gloo, nccl=nccl)}, 2)
    assert found and all("where gloo passed" in v.text and "NCCL_SOCKET_IFNAME" in v.fix for v in found)


def test_container_verdicts_name_what_is_not_bound_in() -> None:
    from hpctorch.doctor.diagnosis import _container_verdicts

    report = {"node": 1, "host": "n2", "container": "apptainer",
              "shared_dir": {"path": "/lus/proj", "visible": False, "writable": False},
              "infiniband": {"interfaces": ["ib0"], "devices": False}}
    texts = [v.line() for v in _container_verdicts(report)]
    assert any("FAIL node 1 (n2): the shared directory /lus/proj is not there inside the apptainer container" in t for t in texts)
    assert any("/dev/infiniband inside the apptainer container" in t for t in texts)
    fine = {**report, "shared_dir": {"path": "/lus/proj", "visible": True, "writable": True}, "infiniband": {"interfaces": [], "devices": False}}
    assert _container_verdicts(fine) == []
