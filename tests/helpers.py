"""Small configs shared by the tests."""

from configs import smoke


def tiny_config(**overrides):
    """configs/smoke.py with dotted-key overrides, e.g. tiny_config(**{'model.rnn_size': 16})."""
    config = smoke.get_config()
    for key, value in overrides.items():
        node = config
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = value
    return config
