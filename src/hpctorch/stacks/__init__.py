"""Where every rank is: a worker's stack (``dump``: py-spy or the faulthandler fallback),
identical stacks grouped (``groups``), one node's collection published and the job's merged
through the store (``job``), and ``hpctorch stacks`` (``command``).

May import: the package root's modules, ``schedulers``, ``host``, ``plan``.
"""
