"""Hostlist expansion and compression, checked against Slurm's scontrol and python-hostlist."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpctorch.errors import HpctorchError
from hpctorch.schedulers.hostlist import compress, expand

from ..conftest import require


@pytest.mark.parametrize(
    "expr, names",
    [
        ("node1", ["node1"]),
        ("a,b,a", ["a", "b", "a"]),
        ("n[1,3-5,10]", ["n1", "n3", "n4", "n5", "n10"]),
        ("nid[0001-0003]", ["nid0001", "nid0002", "nid0003"]),
        ("nid[0009-0011]", ["nid0009", "nid0010", "nid0011"]),
        ("gpu[1-2]-ib[0-1]", ["gpu1-ib0", "gpu1-ib1", "gpu2-ib0", "gpu2-ib1"]),
        ("n[9-11],x", ["n9", "n10", "n11", "x"]),
        ("n[5,1-2]", ["n5", "n1", "n2"]),
        ("n[1-2,2]", ["n1", "n2", "n2"]),
        ("n[8-010]", ["n8", "n9", "n10"]),
        ("n[1-2] m", ["n1", "n2", "m"]),
        ("n[1-2],,m", ["n1", "n2", "m"]),
    ],
)
def test_expand_examples(expr: str, names: list[str]) -> None:
    assert expand(expr) == names


@pytest.mark.parametrize(
    "names, expr",
    [
        (["n1", "n2", "n3"], "n[1-3]"),
        (["n3", "n1", "n2"], "n[3,1-2]"),
        (["n1", "n1", "n2"], "n[1,1-2]"),
        (["n01", "n02", "n1"], "n[01-02,1]"),
        (["n9", "n10", "n11"], "n[9-11]"),
        (["n8", "n09"], "n[8,09]"),
        (["x", "n1", "n2"], "x,n[1-2]"),
        (["gpu1-ib0", "gpu1-ib1", "gpu2-ib0"], "gpu1-ib[0-1],gpu2-ib0"),
        (["n1"], "n1"),
    ],
)
def test_compress_examples(names: list[str], expr: str) -> None:
    assert compress(names) == expr


@pytest.mark.parametrize(
    "bad, words",
    [
        ("n[1-", "never closed"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "not a number"),
        ("", "empty"),
        ("n[]", "not a number"),
        ("n1]", "without '['"),
        ("n[1-99999999]", "more than"),
    ],
)
def test_malformed_expressions_name_the_cause(bad: str, words: str) -> None:
    with pytest.raises(HpctorchError) as error:
        expand(bad)
    assert words in str(error.value)
    assert repr(bad) in str(error.value)


# Slurm 22.05 rejects text after a bracket group unless another group follows, so
# generated names are prefix + groups, with a separator between groups.
prefixes = st.text(alphabet="abcxyz", min_size=1, max_size=4)
numbers = st.integers(min_value=0, max_value=120)


@st.composite
def ranges(draw: st.DrawFn) -> str:
    width = draw(st.integers(min_value=1, max_value=4))
    items = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        low = draw(numbers)
        high = low + draw(st.integers(min_value=0, max_value=6))
        items.append(f"{low:0{width}d}" + (f"-{high:0{width}d}" if high > low else ""))
    return ",".join(items)


@st.composite
def expressions(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        name = draw(prefixes)
        for index in range(draw(st.integers(min_value=0, max_value=2))):
            name += ("-" if index else "") + f"[{draw(ranges())}]"
        parts.append(name)
    return ",".join(parts)


host_names = st.lists(
    st.builds(lambda p, n, w: f"{p}{n:0{w}d}", prefixes, numbers, st.integers(min_value=1, max_value=3)) | prefixes,
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def scontrol(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """Slurm's own parser: needs only a config file, no daemon."""
    require(shutil.which("scontrol") is not None, "scontrol (apt-get install slurm-wlm) is not installed")
    conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"
    conf.write_text("ClusterName=oracle\nSlurmctldHost=localhost\nNodeName=localhost CPUs=1\nPartitionName=p Nodes=localhost\n")
    env = dict(os.environ, SLURM_CONF=str(conf))

    def run(*args: str) -> str:
        done = subprocess.run(["scontrol", "show", *args], capture_output=True, text=True, env=env, timeout=10)
        assert done.returncode == 0, done.stderr
        return done.stdout

    return run


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(expressions())
def test_expand_matches_scontrol(scontrol, expr: str) -> None:  # type: ignore[no-untyped-def]
    assert expand(expr) == scontrol("hostnames", expr).split()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host_names)
def test_compress_matches_scontrol(scontrol, names: list[str]) -> None:  # type: ignore[no-untyped-def]
    assert compress(names) == scontrol("hostlist", ",".join(names)).strip()


@settings(max_examples=200, deadline=None)
@given(expressions())
def test_expand_matches_python_hostlist(expr: str) -> None:
    import hostlist as oracle

    assert expand(expr) == oracle.expand_hostlist(expr, allow_duplicates=True, sort=False)


@settings(max_examples=200, deadline=None)
@given(host_names)
def test_compress_round_trips_and_agrees_with_python_hostlist(names: list[str]) -> None:
    import hostlist as oracle

    compressed = compress(names)
    assert expand(compressed) == names
    # python-hostlist sorts and drops duplicates; the set of names must agree.
    assert set(oracle.expand_hostlist(compressed)) == set(names)
