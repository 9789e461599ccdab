"""Stage 2, facts about this machine: its network interfaces (``network``), GPUs and other
accelerators (``devices``), CPUs and NUMA (``affinity``, ``cpulist``), the container it runs
in (``containers``), the settings files (``config``), all gathered into ``facts.HostFacts``;
hpctorch's private folders (``folders``) and signals (``signals``) on this node; the user's
list of bad nodes (``badnodes``), kept across jobs.

Reads the machine, decides nothing. May import: the package root's modules, ``schedulers``.
"""
