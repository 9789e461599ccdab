"""``python -m tests.cluster up [N] | down | status``: the test cluster, by hand."""

from __future__ import annotations

import subprocess
import sys

from .harness import Cluster, missing_requirements


def main(argv: list[str]) -> int:
    action = argv[0] if argv else "status"
    nodes = int(argv[1]) if len(argv) > 1 else 2
    cluster = Cluster(nodes)
    if action == "up":
        missing = missing_requirements()
        if missing:
            print(f"cannot build the cluster here: missing {', '.join(missing)}", file=sys.stderr)
            return 2
        cluster.up()
        print(f"up: {', '.join(cluster.all_names)} (partition debug: {', '.join(cluster.names)}); SLURM_CONF={cluster.conf}")
        print(f"enter a node: nsenter --net=/var/run/netns/{cluster.netns('node1')} bash")
    elif action == "down":
        cluster.down()
        print("down")
    else:
        subprocess.run(["ip", "netns", "list"], check=False)
        subprocess.run(["sinfo", "-N"], env=cluster.env(), check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
