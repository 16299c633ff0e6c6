/* select.c - the port of the OS being compiled for, as one file: what the single-file build
 * (src/shardmm.c) includes, so that the choice of OS stays in port/. With SHARD_MALLOC_NAMES=1 on Linux
 * it brings the C library's malloc names too (malloc.c). */
#if defined(_WIN64)
#include "win64.c"
#else
#include "linux.c"
#if SHARD_MALLOC_NAMES
#include "malloc.c"
#endif
#endif
