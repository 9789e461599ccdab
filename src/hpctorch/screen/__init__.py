"""The screen (``--screen``, ``--spare-nodes``, the doctor): before the workers start, each node
measures itself for a fixed time (``measure``) and its link to the next node (``ringlink``), the
records meet in node 0's store (``exchange``: also what node 0 says and does with its verdict),
and node 0 compares each figure with its kind's median (``judge``, pure).

May import: the package root's modules, ``schedulers``, ``host``, ``plan``, ``stacks``,
``guard`` (node 0's store is opened and sealed as the agreement opens it). torch only inside the
measures that need it.
"""
