"""Run the workers from a node-local copy of their Python environment (``--stage-env``): what
is copied and the key that names it (``environment``), the pack node 0 makes and keeps
(``pack``), the tree of nodes that spreads it over the fabric (``spread``), the copy each node
unpacks and verifies (``unpack``) and mends for its new place (``relocate``), and a node's part
from start to finish (``node``). The root's ``staged`` module tells every later process where
the copy is.

May import: the package root's modules, ``schedulers``, ``host``, ``plan``, ``stacks``,
``guard``, ``screen`` (node 0's store, opened as the screen opens it). Nothing here imports
torch: the copy exists before anything imports it.
"""
