"""Keep a started job whole: the nodes' agreement before the first collective (``agreement``
on the node, ``agreement_worker`` inside rank 0..n), its shared-file channel
(``sharedfiles``), the watchdog that names a dead or silent node and stops the rest
(``watchdog``; ``nodewatch`` runs it beside workers hpctorch started itself), and the
closing summary (``summary``).

May import: the package root's modules, ``schedulers``, ``host``, ``plan``, ``stacks``.
It never imports ``start``: the starter composes the guards, not the other way round.
"""
