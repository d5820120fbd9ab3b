"""Every ds2_jax setting with its default: the ConfigDict of ds2_jax/settings.py, where each
field is typed, explained and checked. Other configs start from the same
`settings.to_config_dict()` and override it: a config file imports only the installed
ds2_jax, so it loads from any folder (its own, yours) with no sys.path entry for configs/.

    python launch.py --config=configs/default.py --workdir=/tmp/ds2 [--config.key=value ...]
"""

import ml_collections

from ds2_jax import settings


def get_config() -> ml_collections.ConfigDict:
    return settings.to_config_dict()
