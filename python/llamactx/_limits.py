"""Numbers llama.cpp gives a meaning to, shared by the command line and the server."""

__all__ = ["INT32_MAX", "RANDOM_SEED"]

#: The largest count llama.cpp's `int32_t` parameters (tokens, sizes, ids) hold.
INT32_MAX = 2**31 - 1
#: llama.cpp's LLAMA_DEFAULT_SEED: a sampler given it seeds itself at random.
RANDOM_SEED = 2**32 - 1
