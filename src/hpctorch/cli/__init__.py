"""The command line: ``main`` (one handler per subcommand, errors as one line), ``parser``
(every subcommand's options, a bad command line as one line) and ``torchrun`` (torchrun's
options, under their names and meanings).

May import every stage; nothing imports it but ``__main__``.
"""

import sys

from .. import listed_imports

# Before this package's modules are imported: under --stage-env they come from the shared file
# system, once per node, before the node's copy exists (docs/staging.md, "What it costs").
if listed_imports.wanted(sys.argv):
    listed_imports.install()
