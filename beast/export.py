"""`python -m beast.export RUN_DIR --format torchscript|onnx [--checkpoint best] [-o FILE]`:
the command line of beast/trained/export.py (docs/export.md).

A module of its own, which nothing in beast imports, so that the package's attribute
`beast.export` stays the API function (importing a submodule would bind the module there).
"""

import sys

from beast.trained.export import main

if __name__ == "__main__":
    sys.exit(main())
