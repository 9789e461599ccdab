"""Stage 3, decide: Allocation + Options + HostFacts -> Plan, a pure function
(``decide.make_plan``) over small deciders (``fabric``: the interface, ``master``, ``ports``,
``placement``: CPUs and devices per worker, ``workerenv``: each worker's environment,
``sites``: known machines' conventions). ``types`` holds the Plan, ``render`` prints it.
``discover.plan_here`` is everything before acting: detect, gather facts, and where the
launcher names no nodes, find them out (``bootstrap``: an MPI allgather; ``rendezvous``:
the shared-file address exchange).

May import: the package root's modules, ``schedulers``, ``host``. Never torch.
"""
