"""Write benchmarks/RESULTS.md and the plots from the JSON each benchmark saved."""

from __future__ import annotations

import json

from .common import HERE, RESULTS, summary, table

ORDER = ("first_collective", "plan_latency", "plan_scale", "bootstrap", "port_collisions", "teardown", "control_plane_scale", "store_wait",
         "straggler_overhead", "stage_spread", "auth_cost", "restart", "stage_hot")


def _load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _stats(values: list[float], base: float | None = None) -> list[str]:
    s = summary(values)
    cells = [f"{s['median']:.2f}", f"{s['min']:.2f} / {s['max']:.2f}"]
    return cells + ([f"{s['median'] / base:.2f}"] if base else [])


def first_collective(data: dict) -> str:
    parts = []
    for setup, block in data["results"].items():
        if not isinstance(block, dict):
            parts.append(f"**{setup}** (one try on the same cluster, 60 s limit): {block}.")
            continue
        times = block["times"]
        base = summary(next(iter(times.values())))["median"]
        parts.append(f"**{setup}** ({block['where']}), {data['repeats']} interleaved runs each:\n\n" +
                     table(["command", "median s", "min / max s", "ratio to torchrun"], [[n, *_stats(v, base)] for n, v in times.items()]))
    _plot_first_collective(data)
    return "\n\n".join(parts) + "\n\n![time to first collective](plots/first_collective.png)"


def _plot_first_collective(data: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    blocks = [(setup, block) for setup, block in data["results"].items() if isinstance(block, dict)]
    figure, axes = plt.subplots(1, len(blocks), figsize=(6 * len(blocks), 3.6), squeeze=False)
    for axis, (setup, block) in zip(axes[0], blocks):
        names = list(block["times"])
        medians = [summary(block["times"][n])["median"] for n in names]
        lows = [m - summary(block["times"][n])["min"] for n, m in zip(names, medians)]
        highs = [summary(block["times"][n])["max"] - m for n, m in zip(names, medians)]
        axis.barh(range(len(names)), medians, xerr=[lows, highs], color=["#888"] + ["#2a7"] * (len(names) - 1))
        axis.set_yticks(range(len(names)), [n.replace(" (", "\n(") for n in names], fontsize=7)
        axis.invert_yaxis()
        axis.set_xlabel("seconds, command to every rank done (median, min-max)")
        axis.set_title(setup)
    figure.tight_layout()
    (HERE / "plots").mkdir(exist_ok=True)
    figure.savefig(HERE / "plots" / "first_collective.png", dpi=110)


def plan_latency(data: dict) -> str:
    ms = data["ms"]
    base = summary(ms["python -c pass"])["median"]
    rows = [[n, f"{summary(v)['median']:.1f}", f"{summary(v)['min']:.1f} / {summary(v)['max']:.1f}", f"{summary(v)['median'] - base:.1f}"] for n, v in ms.items()]
    top = ", ".join(f"{n} {t:.1f} ms" for n, t in data["import_top"])
    return (table(["command", "median ms", "min / max ms", "minus python -c pass, ms"], rows) +
            f"\n\n`import hpctorch.cli.main` (what `hpctorch plan` loads): {data['import_ms']:.1f} ms cumulative (python -X importtime); most expensive: {top}. "
            f"torch imported: {'yes' if data['torch_imported'] else 'no'}.")


def plan_scale(data: dict) -> str:
    rows = [[d["nodes"], d["world_size"], f"{d['seconds'] * 1e3:.2f}", f"{d['seconds'] / d['nodes'] * 1e6:.2f}",
             f"{d['peak_bytes'] / 2**20:.2f}", f"{d['peak_bytes'] / d['nodes']:.0f}"] for d in data["sizes"]]
    _plot_plan_scale(data)
    return (table(["nodes", "world size", "time ms (best)", "us per node", "peak MiB", "bytes per node"], rows) +
            f"\n\nTime grew {data['growth_vs_linear']:.2f}x as fast as the node count from the smallest to the largest "
            "allocation (1 = linear).\n\n![plan scale](plots/plan_scale.png)")


def _plot_plan_scale(data: dict) -> None:
    nodes = [d["nodes"] for d in data["sizes"]]
    scale = data["sizes"][-1]["seconds"] * 1e3 / nodes[-1]
    _loglog_plot("plan_scale.png", "nodes in the allocation", "Allocation + Plan (Slurm, per-task, 2-4 tasks per node)", [
        (nodes, [d["seconds"] * 1e3 for d in data["sizes"]], "o-", "time per call, ms"),
        (nodes, [d["peak_bytes"] / 2**20 for d in data["sizes"]], "s-", "peak memory, MiB"),
        (nodes, [n * scale for n in nodes], ":", "linear (through the last point)"),
    ])


def bootstrap(data: dict) -> str:
    parts = []
    if data["mpi"]:
        parts.append("MPI allgather (`mpirun -np N --oversubscribe`):\n\n" + table(
            ["ranks", "mpirun python -c pass, s", "mpirun hpctorch plan --json, s", "difference, s"],
            [[d["ranks"], f"{d['python']:.2f}", f"{d['hpctorch']:.2f}", f"{d['hpctorch'] - d['python']:.2f}"] for d in data["mpi"]]))
    parts.append("Shared-file exchange of the master's address:\n\n" + table(
        ["processes", "wall s (start to all done)", "node 0's write to the last read, s"],
        [[d["processes"], f"{d['wall']:.2f}", f"{d['write_to_last_read']:.3f}"] for d in data["shared_file"]]))
    return "\n\n".join(parts)


def port_collisions(data: dict) -> str:
    return table(["command", "jobs at once", "failed", "wall s", "a failure's last line"],
                 [[n, d["jobs"], d["failures"], f"{d['wall_s']:.1f}", f"`{d['example']}`" if d["example"] else ""] for n, d in data.items()
                  if isinstance(d, dict) and "jobs" in d])


def teardown(data: dict) -> str:
    return (f"{data['where']}; compute phase {data['compute_seconds']:.0f} s with no collective; rank 3 (node 2) "
            "kills itself 2 s into it.\n\n" +
            table(["command", "death to last exit, median s", "min / max s"], [[n, *_stats(v)] for n, v in data["times"].items()]))


def restart(data: dict) -> str:
    import statistics

    base = statistics.median(data["times"]["torchrun, c10d by hand"])
    return (f"{data['where']}, 2 ranks each, `--max-restarts 1`; every step an all_reduce of 256 KiB and 0.1 s of compute; "
            "rank 3 (node 2) is SIGKILLed at step 25 of the first attempt. Time lost: the first step after the restart minus "
            "the last step before, on rank 0's clock, interleaved runs. torchrun is typed as a user must on this cluster: c10d "
            "rendezvous at node 1's fabric address, `is_host` and `--local-addr` per node, `GLOO_SOCKET_IFNAME`, and torch's "
            "own fresh-store opt-out (`TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`, which hpctorch sets too: without it torchrun's "
            "restart failed here). hpctorch's restart runs in warm standbys (torch imported ahead, `start.standby`; forked from "
            "one process per node that imported torch once, `start.zygote`, or each its own process with `HPCTORCH_STANDBY=spawn`), and a "
            "node waiting in torch's rendezvous learns of the next round's opening and of its completion when they happen "
            "(`start.roundwake`), not at torch's next once-a-second read; `HPCTORCH_STANDBY=0` starts new processes, as torch's agent does. The "
            "attempt each rank runs is read from the killed rank's mark, not `TORCHELASTIC_RESTART_COUNT` (each node's own "
            "count: a node restarted by its peer keeps 0). The goal was at most 0.4x torchrun's. CPU: every process of the job on "
            "both nodes, start to end (each reaped by its parent, up to the benchmark's).\n\n" +
            table(["command", "time lost, median s", "min / max s", "of torchrun's", "CPU s, median"],
                  [[n, *_stats(v), f"{statistics.median(v) / base:.2f}x",
                    f"{statistics.median(data['cpu_s'][n]):.1f}" if n in data.get("cpu_s", {}) else "-"] for n, v in data["times"].items()]))


def control_plane_scale(data: dict) -> str:
    rows = [[r["nodes"], f"{r['requests_per_s']:.0f}", f"{r['per_node_per_s']:.2f}", r["false_alarms"],
             f"{r['abort_known_s']:.2f}", r["never_knew"], f"{r['agreement_s']:.2f}",
             f"{r['agreement_cpu_s']:.1f}" if "agreement_cpu_s" in r else "-"] for r in data["rows"]]
    _plot_control_plane(data)
    notes = "".join(f"\n\n{note}" for note in data.get("notes", ()))
    return (f"Simulated nodes: the real `JobWatchdog` and `agreement.check`, one per node, as threads in "
            f"{data.get('processes', 8)} processes, against one real TCPStore; {data['idle_s']:.0f} s of idle watching per size.\n\n" +
            table(["nodes", "store requests/s", "per node/s", "false alarms", "abort known by all (s)", "never knew",
                   "agreement (s)", "agreement CPU (s)"], rows) + notes + "\n\n![control plane scale](plots/control_plane_scale.png)"
            + _shared_files(data) + _screen(data) + _stragglers(data) + _spares(data))


def _spares(data: dict) -> str:
    from .control_plane_scale import SPARES_HEADER, spares_cells

    return _part(data, "spares", "Hot spares (`--spare-nodes` with `--max-restarts`", (
        "every seated node, "
        "simulated as threads in 8 processes, runs the real `Seat.failed` as all workers fail at once, the way one rank's "
        "death breaks every collective: the node whose rank was killed claims the round's fault at once, the others after "
        "their 1 s wait. One `compare_set` per node, once per failure (the winner adds one to the spares used); spares "
        "waiting make torch's own rendezvous requests (a sync a second), none of hpctorch's once the first round is "
        "complete. 'every verdict' is from the end of the wait until the last node knew whether it leaves: a burst of N "
        "requests on node 0's store, here from 2 shared cores. Exactly one node leaves, the one whose rank was killed."),
        SPARES_HEADER, spares_cells)


def _part(data: dict, name: str, title: str, prose: str, header: list[str], cells) -> str:  # type: ignore[no-untyped-def]
    """One part of benchmark 7 run on its own (``--only``): its title, date and command, what it
    measures, its table; nothing when it was never run."""
    rows = data.get(f"{name}_rows")
    if not rows:
        return ""
    return (f"\n\n{title}; {data.get(f'{name}_date', data['date'])}, `{data.get(f'{name}_command', data['command'])}`): {prose}\n\n"
            + table(header, cells(rows)))


def _screen(data: dict) -> str:
    from .control_plane_scale import SCREEN_HEADER, screen_cells

    return _part(data, "screen", "The screen (`--screen`, and the doctor", (
        "node 0 runs the real "
        "`screen.run` and the others, simulated as threads in 8 processes, too, with a record standing in for their "
        "measures (their own CPUs' work, done in parallel on real nodes) and no ring link (one machine). Requests per "
        "node: a flat 7 (address, arrival, the go, record, arrived, the verdict, its acknowledgement; the two waits "
        "block in the store). Node 0 reads the records that arrived, the new ones in one `multi_get`, with backoff. "
        "'go to verdict' is node 0's collection and judgement once every node arrived, bounded by the budget (15 s "
        "in a job); 'with arrivals' adds the simulated nodes' start (importing torch in 8 processes on 2 cores). One "
        "node in 64 carries a slow CPU: every one is named."), SCREEN_HEADER, screen_cells)


def straggler_overhead(data: dict) -> str:
    rows = [[r["backend"], r["ranks"], f"{r['width']} x 8, {r['bucket_mb']:g} MB buckets, batch {r['batch']}",
             f"{r['step_off_s'] * 1e3:.2f}", f"{r['step_on_s'] * 1e3:.2f}", f"{r['step_overhead']:+.1%}",
             f"{r['collective_off_us']:.0f}", f"{r['collective_on_us']:.0f}", f"{r['wrapper']['blocking_us']:.1f} / {r['wrapper']['asynchronous_us']:.1f}"]
            for r in data["rows"]]
    return ("The same DDP job through `hpctorch run` with `--stragglers off` and on (the default), interleaved; rank 0's median "
            "step after 10 untimed ones, and a 1-element all_reduce in a loop. The last column is the host timing's own cost per "
            "gloo collective (the real wrapper around a collective that does nothing, blocking / asynchronous), which sets the "
            "overhead wherever a step holds several milliseconds per collective. NCCL rows: "
            f"{data.get('gpu_machine', 'a GPU machine')}; there the recorder is read every 5 s and the cost is CUDA-event timing "
            "(`TORCH_NCCL_ENABLE_TIMING`). The tiny NCCL case (2.6 ms steps of 9 collectives, 3 repeats) measured +12%, "
            "while its 1-element all_reduce showed none; a 17 ms step costs 0.4%. Under gloo, DDP's reducer goes through "
            "torch's allreduce comm hook with its one Python callback also noting the time (a second callback per bucket "
            "had cost 3-6% of this 30 ms step).\n\n" +
            table(["backend", "ranks", "model", "step off (ms)", "step on (ms)", "step", "all_reduce off (us)", "all_reduce on (us)",
                   "wrapper per collective (us)"], rows))


def stage_spread(data: dict) -> str:
    from .stage_spread import HEADER, SLOW_HEADER, cells, slow_cells

    slow = data.get("slow_node", [])
    return ("`--stage-env`'s spread: node 0's pack through the real tree (`stage.spread.take_part`, k = "
            f"{data['rows'][0]['fanout']} children per node; a node with children keeps the bytes as they arrive in an unnamed "
            "file of its own and sends them to each child from a thread of its own with `sendfile`), each "
            f"simulated node a thread in {data['processes']} processes reaching torch's TCPStore with hpctorch's own client, "
            "over loopback in a network namespace of its own (as benchmark 7); every node checks the SHA-256 of what it got. "
            "The time runs from node 0's go to the last node's last byte. Every node's bytes cross this machine's 2 cores, "
            "so N copies of the payload share them and the time grows with N here, at a flat 0.5-0.8 GiB/s of all nodes' "
            "bytes together: the cores set the pace, not the tree's depth (the spool costs each node with children one more "
            "copy of the bytes through memory than the blocking relay before it, 0.7-0.9 GiB/s here, and 4,096 nodes' "
            "spools, a quarter of the nodes', write 4 GiB through one machine's page cache); on a cluster each node has its "
            "own link and CPUs, and a pipelined tree takes about size / "
            "(link bandwidth / k) plus one chunk per hop (2 GB at 10 GB/s per link and k = 4: under a second, plus depth x "
            "0.1 ms). The shared copy is read once per job, and node 0 sends k copies whatever N. For comparison, ALCF's ezpz "
            "copies an environment to every node with `yeet` over rsync/ssh in 255 s at 1,024 nodes and 750 s at 4,096 "
            "nodes on Aurora (published figures; a real machine, not comparable with this simulation except in shape: theirs "
            "grows with N, a tree's with log N).\n\n" + table(HEADER, [cells(r) for r in data["rows"]]) +
            ("\n\nOne slow node: 64 MiB over 4 nodes as threads, k = 2 (node 0 -> 1, 2; node 1 -> 3), node 1 extracting at "
             "5 MiB/s, a 3 s deadline (`HPCTORCH_STAGE_TIMEOUT_S`). Its sibling and its child finish as fast as with no slow node, "
             "and node 1 stops at its deadline, its child served. Before (a parent forwarded with a blocking send from its own "
             "extraction loop, limited only by 60 s without progress), the sibling finished at 11.8 s, not 0.3 s, and node 1 "
             "went on past the deadline.\n\n" + table(SLOW_HEADER, [slow_cells(r) for r in slow]) if slow else ""))


def stage_hot(data: dict) -> str:
    from .stage_hot import BESIDE_HEADER, HEADER, beside, cells

    full, hot = data["full"], data["hot"]
    return (f"One real staged run (`hpctorch run --stage-env`, one node) of `{' '.join(data['script'])}` from this test run's "
            f"environment ({data['files']:,} files, {data['bytes'] / 2**30:.2f} GiB: {', '.join(data['environment'])}); its worker "
            f"recorded {hot['recorded']:,} of the copy's files (what it opened, what was mapped into it, and the sources of the "
            "bytecode it read). Node 0's later pack for a node without a copy carries those whole and every other file, or every "
            "folder holding none of them, as a link to its original on the shared path: "
            f"{hot['bytes'] / 2**20:,.0f} MiB against {full['bytes'] / 2**20:,.0f} MiB ({100 * hot['bytes'] / full['bytes']:.0f}%), "
            f"{hot['linked']:,} links (one per folder where it can: a link costs the node a block of its disk, 0.5 ms each here, "
            "so one per file made the smaller pack slower to take). What is hot is one CPU job's: torch's CPU library is most of "
            "its bytes; a GPU job's set holds the CUDA libraries it loads, and not those it never does. Each pack is taken as a node "
            "takes it (`unpack.receive`: extracted, checked, mended). Per-hop "
            f"throughput is the real tree's (benchmark 10's `simulate`, {data['hop_mib']:g} MiB): one parent to 4 children over "
            f"loopback on this machine took {data['four_children_s']:.2f} s ({data['hop_mib'] / data['four_children_s']:.0f} MiB/s "
            f"to each child; to one child alone {data['hop_mib'] / data['one_child_s']:.0f} MiB/s). The model for N nodes, the pack "
            "kept (node 0 packs once per environment and hot set): a pipelined tree delivers S bytes to every node in S / r plus "
            "one chunk per hop (depth log_4 N), r the slower of the per-child rate and a node's taking rate; every node's store "
            "requests are the same few whatever N (benchmark 10). A staged start adds to it what does not grow with N: node 0's "
            "walk of the environment for its key (2 s here, docs/staging.md) and the workers' own start from their copies. So the time grows with log N and with the bytes: the hot set "
            "divides the bytes, a faster fabric and disk the rate (here a node's taking is the slower, and a core moves every "
            "byte; at 10 GB/s links, k = 4, a parent feeds each child 2.5 GB/s). A node then reads what the job did not read before from the shared path, through the link, as "
            "without staging. ALCF's ezpz (`yeet` over rsync/ssh, Aurora) is a published figure on a real machine, not this "
            "model: beside it for the shape, linear in N where a tree is logarithmic.\n\n" + table(HEADER, cells(data)) + "\n\n" +
            table(BESIDE_HEADER, beside(data)))


def _stragglers(data: dict) -> str:
    from .control_plane_scale import STRAGGLE_HEADER, straggle_cells

    return _part(data, "straggle", "The straggler watch (`--stragglers`, on by default", (
        "every node, simulated as "
        "threads in 8 processes, runs the real `Watch` over 8 workers' files (running totals, 10 s apart) and sets its one "
        "record a round (every 10 s in a job); node 0 reads every record in one `multi_get` and judges every rank. One node in "
        "64 has a rank that spends 5% of its time inside collectives while the others spend 45%: each one is named. The "
        "record grows with the ranks of a node, not with N. Node 0's step (read every record, judge) is timed while the "
        "simulated nodes' 8 processes still share the 2 cores; the judgement alone (parse and judge every rank) is what node "
        "0's watchdog spends every 10 s."), STRAGGLE_HEADER, straggle_cells)


def _shared_files(data: dict) -> str:
    header = ["nodes", "file calls per node per poll", "at node 0 per poll", "node 0 until all seen", "all seen after (polls)",
              "before: per node per poll", "one poll of all nodes (s)"]
    return _part(data, "files", "The shared-file channel (`sharedfiles.BeatingFiles`: the agreement and the doctor, through the submit "
                 "directory", (
                     "every "
                     "simulated node publishes and reads once a poll (a poll is a second at the real 1 s interval), on this "
                     "machine's local disk. A node writes its record once and then only moves its file's time (one `utime`); a "
                     "node other than 0 opens node 0's file alone; node 0 scans the folder once a poll and reads a file only when "
                     "it was replaced, with a `stat` per peer only until it has seen that peer beat. Before, every node read every "
                     "node's file every second ('before')."), header,
                 lambda rows: [[r["nodes"], r["files_per_node_per_poll"], r["files_node0_per_poll"], r["files_node0_until_seen"],
                                r["files_all_seen_poll"], r["files_old_per_node_per_poll"], f"{r['files_poll_s']:.2f}"] for r in rows])


def _plot_control_plane(data: dict) -> None:
    rows = data["rows"]
    nodes = [r["nodes"] for r in rows]
    _loglog_plot("control_plane_scale.png", "nodes", "Watchdog load and abort propagation (one TCPStore)", [
        (nodes, [r["requests_per_s"] for r in rows], "o-", "store requests/s, all nodes"),
        (nodes, [r["per_node_per_s"] for r in rows], "s-", "store requests/s per node"),
        (nodes, [r["abort_known_s"] for r in rows], "^-", "abort known by every node, s"),
        (nodes, [r["agreement_s"] for r in rows], "d-", "agreement, s"),
    ])


def store_wait(data: dict) -> str:
    rows = [[r["ranks"], f"{r['cap_s']:.2f}", f"{r['refused_per_s']:.0f}", f"{r['bound_per_s']:.0f}",
             f"{r['released_median_s']:.3f}", f"{r['released_last_s']:.3f}"] for r in data["rows"]]
    return (f"The real `storewait.wait`, one per simulated rank, as threads in {data['processes']} processes, against a loopback "
            f"port closed for {data['settle_s'] + data['window_s']:.0f} s, then a listening socket; refusals counted over the last "
            f"{data['window_s']:.0f} s before the listen. torch's own client, refused, sleeps 0.25-0.75 s, then x1.5 each try, "
            "up to 60 s.\n\n" +
            table(["waiting ranks", "pause cap (s)", "refused/s at rank 0", "bound/s", "released after listen: median s", "last s"], rows) +
            "".join(f"\n\n{note}" for note in data.get("notes", ())))


def auth_cost(data: dict) -> str:
    rows = [[r["mechanism"], f"{summary(r['publish_ms'])['median']:.2f}", f"{summary(r['verify_ms'])['median']:.2f}",
             f"{summary(r['verify_ms'])['min']:.2f} / {summary(r['verify_ms'])['max']:.2f}", r["verify_requests"],
             f"{r['record_us']:.1f}"] for r in data["rows"]]
    return (f"The real `authority.publish` (node 0, once per store it serves) and `authority.verify` (every node, once per "
            f"store it joins) against a TCPStore on loopback, {data['repeats']} fresh runs each; then sealing and opening a "
            "200-byte record. A node's verify makes the same store requests whatever the node count.\n\n" +
            table(["mechanism", "node 0's publish: median ms", "a node's verify: median ms", "min / max ms", "store requests per node",
                   "seal + open a record (us)"], rows))


def _loglog_plot(name: str, xlabel: str, title: str, lines: list[tuple[list, list, str, str]]) -> None:
    """One log-log figure of (x, y, style, label) lines, saved under plots/."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.6))
    for xs, ys, style, label in lines:
        axis.loglog(xs, ys, style, label=label, **({"color": "#999"} if style == ":" else {}))
    axis.set_xlabel(xlabel)
    axis.set_title(title)
    axis.legend(fontsize=8)
    figure.tight_layout()
    (HERE / "plots").mkdir(exist_ok=True)
    figure.savefig(HERE / "plots" / name, dpi=110)


TITLES = {
    "first_collective": "1. Time to first collective",
    "plan_latency": "2. Plan latency",
    "plan_scale": "3. Scale of planning",
    "bootstrap": "4. Bootstrap at scale",
    "port_collisions": "5. Port collisions",
    "teardown": "6. Teardown after a kill -9",
    "control_plane_scale": "7. Control plane at scale",
    "store_wait": "8. Ranks waiting for rank 0's store",
    "straggler_overhead": "9. What the straggler watch costs a running job",
    "stage_spread": "10. Spreading the staged environment over the nodes (`--stage-env`)",
    "auth_cost": "11. What authenticating node 0's store costs",
    "restart": "12. The time a restart loses (`--max-restarts`)",
    "stage_hot": "13. What a hot set's pack carries, and a staged start at 16 -> 4,096 nodes by model (`--stage-env`)",
}


def main() -> None:
    sections = ["# Benchmark results", "",
                "Made by `make bench` (each script: `python -m benchmarks.<name>`); the numbers below come from "
                "benchmarks/results/*.json, written by those runs, and are rendered by `python -m benchmarks.report`."]
    for name in ORDER:
        data = _load(name)
        if data is None:
            sections += ["", f"## {TITLES[name]}", "", "(not run)"]
            continue
        body = globals()[name](data)
        sections += ["", f"## {TITLES[name]}", "", f"Machine: {data['machine']}. Date: {data['date']}. Command: `{data['command']}`.", "", body]
    (HERE / "RESULTS.md").write_text("\n".join(sections) + "\n")
    print(HERE / "RESULTS.md")


if __name__ == "__main__":
    main()
