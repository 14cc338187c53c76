"""The `causeway` command line."""

import os

from streams.settings import JEMALLOC_CONF_DEFAULT, JEMALLOC_CONF_ENV

# Arrow's bundled jemalloc (the worker's memory pool) reads its options when libarrow loads, so they
# must be in the environment before anything imports pyarrow: this package runs first in every
# `causeway` process. An operator's own value is kept.
os.environ.setdefault(JEMALLOC_CONF_ENV, JEMALLOC_CONF_DEFAULT)
