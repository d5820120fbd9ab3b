"""Every ds2_jax setting with its default: the ConfigDict of ds2_jax/settings.py, where each
field is typed, explained and checked. Other configs import and override this.

    python launch.py --config=configs/default.py --workdir=/tmp/ds2 [--config.key=value ...]
"""

import ml_collections

from ds2_jax import settings


def get_config() -> ml_collections.ConfigDict:
    return settings.to_config_dict()
