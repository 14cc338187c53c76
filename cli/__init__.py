"""The `causeway` command line."""

import os

from streams.settings import (
    ARROW_CPP_POOL_DEFAULT,
    ARROW_POOL_ENV,
    JEMALLOC_CONF_DEFAULT,
    JEMALLOC_CONF_ENV,
    env_name,
    native_pool_env,
)

# Arrow's bundled jemalloc (the worker's memory pool) reads its options when libarrow loads, so they
# must be in the environment before anything imports pyarrow: this package runs first in every
# `causeway` process. An operator's own value is kept.
os.environ.setdefault(JEMALLOC_CONF_ENV, JEMALLOC_CONF_DEFAULT)
# Arrow's C++ code (the Parquet reader and writer, compute kernels) allocates from the pool libarrow
# picks when it loads, not from the one `streams.memory.configure` sets later for pyarrow's calls.
_native = native_pool_env(os.environ.get(env_name("arrow_cpp_pool"), ARROW_CPP_POOL_DEFAULT))
if _native is not None:
    os.environ.setdefault(ARROW_POOL_ENV, _native)
