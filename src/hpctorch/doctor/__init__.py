"""``hpctorch doctor``: run like the job on every node and say why it would not start
(``command``), what each node reports of itself (``report``), the verdicts and their
table (``diagnosis``).

May import every stage (``schedulers`` to ``start``), never ``cli`` or ``submit``.
"""
