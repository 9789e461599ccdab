"""``--rdzv-backend file``: the seed's Windows path, torch's own ``FileStore`` in a directory
instead of a TCP store, for machines where a local TCP store is blocked or fails (Windows
firewalls, torch builds whose TCPStore lacks libuv), and usable across nodes that share the
directory.

Two stores, both torch's FileStore in that directory: ``<run id>.agents`` for the agents (the
rendezvous: torch's agent assigns ranks and runs its exit barrier through it) and
``<run id>.workers``, which every worker's ``init_process_group`` uses instead of env://
(``_worker.py`` puts torch's file store behind the env:// scheme when HPCTORCH_FILE_STORE
is set: the script is unchanged). FileStore removes its file once every user closed it;
node 0 removes what a failed run left, and the workers' file after a run that succeeded.
"""

from __future__ import annotations

import os

BACKEND = "file"
WORKERS_ENV = "HPCTORCH_FILE_STORE"


def paths(directory: str, run_id: str) -> tuple[str, str]:
    """The agents' and the workers' store files of one run."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)
    return os.path.join(directory, f"hpctorch-{safe}.agents"), os.path.join(directory, f"hpctorch-{safe}.workers")


def remove(directory: str, run_id: str, workers_only: bool = False) -> None:
    """What a run left: both stores after a failure; after a success the workers' alone (torch's
    exit barrier, through the agents' store, has passed on every node: no worker uses it, but a
    worker that exited without destroying its store leaves the file behind)."""
    for path in paths(directory, run_id)[1 if workers_only else 0:]:
        try:
            os.remove(path)
        except OSError:
            pass


def register() -> None:
    """Make ``file`` a rendezvous backend of torch's elastic agent (once per process)."""
    from torch.distributed import FileStore, PrefixStore
    from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters, rendezvous_handler_registry

    class FileRendezvous(RendezvousHandler):
        """torch's static rendezvous, with a FileStore where it has a TCPStore: every node
        knows its rank and the node count, so there is nothing to negotiate."""

        def __init__(self, params: RendezvousParameters) -> None:
            self.run_id = params.run_id
            self.rank = int(params.config["rank"])
            self.nnodes = params.max_nodes
            self.path = paths(str(params.config["path"]), params.run_id)[0]
            self.store = None

        def get_backend(self) -> str:
            return BACKEND

        @property
        def use_agent_store(self) -> bool:
            return False  # workers use their own file store (HPCTORCH_FILE_STORE)

        def next_rendezvous(self):  # type: ignore[no-untyped-def]
            if self.store is None:
                self.store = FileStore(self.path, self.nnodes)
            store = PrefixStore(self.run_id, self.store)
            try:
                from torch.distributed.elastic.rendezvous.api import RendezvousInfo, RendezvousStoreInfo
            except ImportError:  # torch < 2.4: a tuple
                return store, self.rank, self.nnodes
            # Workers read MASTER_ADDR/MASTER_PORT from this, and do not use them.
            return RendezvousInfo(store, self.rank, self.nnodes, RendezvousStoreInfo("127.0.0.1", 1))

        def is_closed(self) -> bool:
            return False

        def set_closed(self) -> None:
            pass

        def num_nodes_waiting(self) -> int:
            return 0

        def get_run_id(self) -> str:
            return self.run_id

        def shutdown(self) -> bool:
            return True

    try:
        rendezvous_handler_registry.register(BACKEND, FileRendezvous)
    except ValueError:
        pass  # registered already in this process


def env_by_file(path: str) -> None:
    """In a worker: ``init_process_group``'s env:// (its default) rendezvous through torch's
    FileStore at ``path`` with RANK and WORLD_SIZE, instead of a TCPStore at MASTER_ADDR."""
    import importlib

    from torch.distributed import FileStore

    rendezvous = importlib.import_module("torch.distributed.rendezvous")  # the module, not its function

    def handler(url: str, timeout=None, **_kwargs):  # type: ignore[no-untyped-def]
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        store = FileStore(path, world_size)
        if timeout is not None:
            store.set_timeout(timeout)
        yield store, rank, world_size
        raise RuntimeError("Unable to perform re-rendezvous using hpctorch's file store")

    rendezvous._rendezvous_handlers["env"] = handler  # torch's registry refuses a second "env"
