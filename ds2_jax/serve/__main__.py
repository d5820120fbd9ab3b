"""python -m ds2_jax.serve: see ds2_jax.serve.server."""

import sys

from ds2_jax import errors
from ds2_jax.serve import server

sys.exit(errors.run_explained(server.main, None, errors.traceback_wanted()))
