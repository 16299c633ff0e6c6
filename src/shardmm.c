/* shardmm.c - the single-file build: the whole core and the port of the target OS in one translation
 * unit, for an embedder who adds shardmm to their own build instead of linking a library.
 *
 *   nasm -f elf64 -Ishardmm/asm/ shardmm/asm/fast.asm -o shardmm-fast.o     (-f win64 on Windows)
 *   cc -O2 -c -Ishardmm/include shardmm/src/shardmm.c -o shardmm.o
 *   cc ... your objects ... shardmm.o shardmm-fast.o -pthread
 *
 * Defines (on the compiler's command line):
 *   SHARD_ASM=0           the C fast paths instead of asm/fast.asm (then no NASM step; the default is 1)
 *   SHARD_MALLOC_NAMES=1  also define malloc, free, calloc, realloc and the rest of the malloc family
 *                         (port/malloc.c; Linux), so the program's every allocation goes to shardmm
 *   SHARD_DEBUG=1         assertions and the consistency checks after slow paths
 *   SHARD_FULL_DEBUG=1    the debug layer for finding a program's bugs (debugmode.c: canaries, fill
 *                         patterns, a quarantine, reports with allocation and free sites); needs
 *                         SHARD_ASM=0
 *   SHARD_PORT_REGION     the region port (port/region.c, include/shardmm_region.h) instead of the OS's:
 *                         no OS and no C library at all (give NASM the same define: the heap slot
 *                         is then the embedder's function, port/port.h)
 *   SHARD_SLOT=N          where the heap slot lives (port/port.h), for C and NASM alike; the default is
 *                         the port's own choice
 * The core needs no C library; the Linux port uses pthread_key_create and pthread_atfork (hence -pthread)
 * and the C library's environ, and the Windows port kernel32. The object exports the shard_ API (and the
 * malloc names when asked for); the rest of its global names (hidden visibility, so a shared library
 * built from it does not export them, but a static link sees them) begin with heap_, small_, medium_,
 * large_, segment_, segmap_, os_, meta_, port_, error_, options_, out_, shard_ or spin_, plus report_error
 * and assert_failed: an embedder with names of its own like these links libshardmm.a instead, whose
 * object has all of them made local.
 */
#ifndef SHARD_ASM
#define SHARD_ASM 1
#endif
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* the Linux port's system-call numbers and pthread declarations */
#endif

#include "api.c"
#include "debugmode.c"
#include "engine.c"
#include "error.c"
#include "heap.c"
#include "large.c"
#include "libc.c"
#include "medium.c"
#include "options.c"
#include "report.c"
#include "segment.c"
#include "small.c"
#include "walk.c"
#include "../port/select.c" /* the port of the OS compiled for (and the malloc names if asked for) */
