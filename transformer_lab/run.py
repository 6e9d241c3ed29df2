"""``python -m transformer_lab.run ARGS``: the bare Hydra application, the same as ``tlab run``
(:func:`transformer_lab.app.hydra_app.main`)."""

import sys

from transformer_lab.app.hydra_app import main

if __name__ == "__main__":
    sys.exit(main())
