"""``hpctorch submit``: a job script for a scheduler from its template (``templates/``), and
its submission (``jobscript``). The one place outside ``schedulers`` that names schedulers.

May import: the package root's modules and ``schedulers``.
"""
