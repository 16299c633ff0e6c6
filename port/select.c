/* select.c - the port being compiled for, as one file: what the single-file build (src/shardmm.c)
 * includes, so that the choice stays in port/. SHARD_PORT_REGION picks the region port (no OS);
 * otherwise the OS compiled for, and with SHARD_MALLOC_NAMES=1 on Linux the C library's malloc names
 * too (malloc.c). */
#if defined(SHARD_PORT_REGION)
#include "region.c"
#elif defined(_WIN64)
#include "win64.c"
#else
#include "linux.c"
#if SHARD_MALLOC_NAMES
#include "malloc.c"
#endif
#endif
