"""Act on a Plan: per node through torch's elastic agent (``launch``) or hpctorch's own
starter (``supervisor``), and what both do with a node's workers (``workers``);
``--simulate-nodes`` (``simulated``, ``agent``); per task by exec (``launch.exec_per_task``);
inside each worker, what runs before the script (``storewait``, ``filestore``; the entry file
is ``hpctorch/_worker.py``); and ``hpctorch.init()`` from a script (``initialize``).

May import every stage before it: the package root's modules, ``schedulers``, ``host``,
``plan``, ``stacks``, ``guard``, ``screen``, ``stage``.
"""
