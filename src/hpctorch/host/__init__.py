"""Stage 2, facts about this machine: its network interfaces (``network``), GPUs and other
accelerators (``devices``), CPUs and NUMA (``affinity``, ``cpulist``), the container it runs
in (``containers``), the settings files (``config``), all gathered into ``facts.HostFacts``;
and hpctorch's private folders (``folders``) and signals (``signals``) on this node.

Reads the machine, decides nothing. May import: the package root's modules, ``schedulers``.
"""
