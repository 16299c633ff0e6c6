/* report.c - the text the introspection functions write: the statistics table (shard_print_stats) and
 * the leak report (shard_report_leaks). Both run in any state of the process (at exit too) and allocate
 * nothing: the numbers come from shard_get_stats and shard_visit, the text goes out through libc.h's
 * text_out, a line at a time.
 *
 * The leak report groups blocks by size - small blocks by their class, medium and large ones by power
 * of two - in a fixed table on the stack, and shows the first few blocks of each group with their
 * first bytes, as FastMM's report does: what a block holds usually says who made it. The full-debug
 * build (debugmode.c) also names each shown block's allocation site, taken during the walk.
 *
 * Depends on: shardmm.h (the API it formats), libc.h (text_out), classes.h (the small classes),
 * debugmode.h (the sites, full-debug build).
 */
#include "../include/shardmm.h"
#include "classes.h"
#include "debugmode.h"
#include "libc.h"

/* ---- statistics -------------------------------------------------------------------------------------- */

/* One row: the name in 34 columns, the figure right-aligned in 10 (bytes with a unit, or a count), a note. */
static void row(text_out *o, const char *what, size_t figure, int is_bytes, const char *note)
{
    out_col(o, what, 34);
    if (is_bytes)
        out_bytes(o, figure, 10);
    else
        out_dec(o, figure, 10);
    if (note[0]) {
        out_str(o, "   ");
        out_str(o, note);
    }
    out_str(o, "\n");
}

static void row_bytes(text_out *o, const char *what, size_t bytes, const char *note) { row(o, what, bytes, 1, note); }
static void row_count(text_out *o, const char *what, size_t count, const char *note) { row(o, what, count, 0, note); }

/* A count of blocks, then their usable bytes. */
static void row_blocks(text_out *o, const char *what, size_t count, size_t bytes)
{
    out_col(o, what, 34);
    out_dec(o, count, 10);
    out_bytes(o, bytes, 12);
    out_str(o, " usable\n");
}

void shard_print_stats(shard_output_fn out, void *arg)
{
    shard_stats s;
    shard_get_stats(&s);
    text_out o;
    out_init(&o, out, arg);
    out_str(&o, "shardmm statistics\n");
    out_str(&o, "memory\n");
    row_bytes(&o, "  reserved (address space)", s.reserved, "");
    row_bytes(&o, "  committed", s.committed, "readable and writable now");
    row_bytes(&o, "  committed, peak", s.committed_peak, "");
    out_str(&o, "live blocks\n");
    row_blocks(&o, "  small (up to 16 KB)", s.live_small, s.live_small_bytes);
    row_blocks(&o, "  medium (up to 1 MB)", s.live_medium, s.live_medium_bytes);
    row_blocks(&o, "  large (above 1 MB)", s.live_large, s.live_large_bytes);
    out_str(&o, "small-block pages (64 KB)\n");
    row_count(&o, "  serving a size class", s.small_pages_used, "");
    row_count(&o, "  free, committed", s.small_pages_free, "");
    row_count(&o, "  decommitted", s.small_pages_decommitted, "");
    row_count(&o, "  became free, since start", s.small_pages_retired, "");
    out_str(&o, "medium-block arenas (4 MB)\n");
    row_count(&o, "  arenas", s.medium_arenas, "");
    row_count(&o, "  without a live block", s.medium_arenas_empty, "");
    row_count(&o, "  of those, decommitted", s.medium_arenas_decommitted, "");
    out_str(&o, "segments for any thread (4 MB)\n");
    row_count(&o, "  spare: empty", s.spare_segments, "segments and arenas");
    row_bytes(&o, "  spare: committed", s.spare_bytes, "");
    row_count(&o, "  orphans: with live blocks", s.orphan_segments, "small segments (ended threads', or full); pages above");
    out_str(&o, "large-block cache\n");
    row_count(&o, "  blocks", s.large_cached, "");
    row_bytes(&o, "  committed", s.large_cached_bytes, "");
    out_str(&o, "heaps\n");
    row_count(&o, "  created", s.heaps, "one per thread running at once");
    row_count(&o, "  waiting for a thread", s.heaps_free, "");
    out_str(&o, "operating system\n");
    row_count(&o, "  calls since start", s.os_calls, "reserve, commit, decommit, release");
    if (s.atomic_ops != 0 || s.lock_acquisitions != 0) {
        row_count(&o, "  atomic operations", s.atomic_ops, "(counters build)");
        row_count(&o, "  lock acquisitions", s.lock_acquisitions, "(counters build)");
    }
    out_flush(&o);
}

/* ---- leaks ------------------------------------------------------------------------------------------- */

#define SAMPLES 3      /* blocks shown per group */
#define SAMPLE_BYTES 32 /* of each, at most */
#define MEDIUM_GROUPS 6  /* (16 KB, 32 KB] .. (512 KB, 1 MB] */
#define LARGE_GROUPS 27  /* (1 MB, 2 MB] .. (2^46 / 2, 2^46]: beyond what a block can be */
#define GROUPS (SHARD_CLASS_COUNT + MEDIUM_GROUPS + LARGE_GROUPS)

typedef struct group {
    size_t count, bytes;
    void *sample[SAMPLES];
    size_t sample_size[SAMPLES];
    unsigned char first[SAMPLES][SAMPLE_BYTES]; /* copied during the walk, while the block is sure to be there */
    void *site[SAMPLES]; /* where it was allocated (full-debug build) */
} group;

typedef struct leaks {
    group g[GROUPS];
    size_t count, bytes;
} leaks;

/* Group of a block: its class for a small one, else by the power of two at or above its size. */
static unsigned group_of(size_t usable, int kind)
{
    if (kind == SHARD_BLOCK_SMALL) {
        unsigned c = 0;
        while (c + 1 < SHARD_CLASS_COUNT && class_size[c] < usable)
            c++;
        return c;
    }
    unsigned log = 0;
    while (((size_t)1 << log) < usable && log < 63)
        log++;
    if (kind == SHARD_BLOCK_MEDIUM)
        return SHARD_CLASS_COUNT + (log > 20 ? 5 : log < 15 ? 0 : log - 15);
    return SHARD_CLASS_COUNT + MEDIUM_GROUPS + (log < 21 ? 0 : log - 21 >= LARGE_GROUPS ? LARGE_GROUPS - 1 : log - 21);
}

static int count_leak(void *arg, void *block, size_t usable, int kind)
{
    leaks *l = arg;
    group *g = &l->g[group_of(usable, kind)];
    if (g->count < SAMPLES) {
        g->sample[g->count] = block;
        g->sample_size[g->count] = usable;
        mem_copy(g->first[g->count], block, usable < SAMPLE_BYTES ? usable : SAMPLE_BYTES);
#if SHARD_FULL_DEBUG
        g->site[g->count] = debugmode_alloc_site(block);
#endif
    }
    g->count++;
    g->bytes += usable;
    l->count++;
    l->bytes += usable;
    return 0;
}

/* "  0x...: 68 65 6c 6c 6f 00 ...  |hello.|": the block's address and the bytes copied from it (by the time
 * the report is written another thread may have freed it and its memory gone back). */
static void show_block(text_out *o, const void *block, size_t usable, const unsigned char *b)
{
    size_t n = usable < SAMPLE_BYTES ? usable : SAMPLE_BYTES;
    out_str(o, "    ");
    out_hex(o, (uintptr_t)block, 12);
    out_str(o, ":");
    for (size_t i = 0; i < n; i++) {
        char hex[4] = {' ', "0123456789abcdef"[b[i] >> 4], "0123456789abcdef"[b[i] & 15], 0};
        out_str(o, hex);
    }
    out_str(o, "  |");
    for (size_t i = 0; i < n; i++) {
        char c[2] = {b[i] >= 32 && b[i] < 127 ? (char)b[i] : '.', 0};
        out_str(o, c);
    }
    out_str(o, "|\n");
}

static void group_title(text_out *o, unsigned i)
{
    if (i < SHARD_CLASS_COUNT) {
        out_str(o, "  small blocks of ");
        out_dec(o, class_size[i], 0);
        out_str(o, " B");
        return;
    }
    unsigned log = i < SHARD_CLASS_COUNT + MEDIUM_GROUPS ? 15 + (i - SHARD_CLASS_COUNT)
                                                         : 21 + (i - SHARD_CLASS_COUNT - MEDIUM_GROUPS);
    out_str(o, i < SHARD_CLASS_COUNT + MEDIUM_GROUPS ? "  medium blocks of " : "  large blocks of ");
    out_bytes(o, (uint64_t)1 << (log - 1), 0);
    out_str(o, " to ");
    out_bytes(o, (uint64_t)1 << log, 0);
}

size_t shard_report_leaks(shard_output_fn out, void *arg)
{
    static leaks l; /* 12 KB: the stack of a thread at exit may be small; one report at a time */
    static int busy;
    text_out o;
    out_init(&o, out, arg);
    if (__atomic_exchange_n(&busy, 1, __ATOMIC_ACQUIRE)) {
        out_str(&o, "shardmm: a leak report is already being written\n");
        return 0;
    }
    mem_zero(&l, sizeof l);
    shard_visit(SHARD_VISIT_ALL, count_leak, &l);
    out_str(&o, "shardmm: ");
    out_dec(&o, l.count, 0);
    out_str(&o, l.count == 1 ? " live block, " : " live blocks, ");
    out_bytes(&o, l.bytes, 0);
    out_str(&o, l.count ? " (of the calling thread, of exited threads and large ones):\n" : "\n");
    for (unsigned i = 0; i < GROUPS; i++) {
        group *g = &l.g[i];
        if (g->count == 0)
            continue;
        group_title(&o, i);
        out_str(&o, ": ");
        out_dec(&o, g->count, 0);
        out_str(&o, g->count == 1 ? " block, " : " blocks, ");
        out_bytes(&o, g->bytes, 0);
        out_str(&o, "\n");
        for (size_t k = 0; k < SAMPLES && k < g->count; k++) {
            show_block(&o, g->sample[k], g->sample_size[k], g->first[k]);
#if SHARD_FULL_DEBUG
            out_str(&o, "      allocated at ");
            debugmode_out_site(&o, g->site[k]);
            out_str(&o, "\n");
#endif
        }
    }
    out_flush(&o);
    size_t count = l.count;
    __atomic_store_n(&busy, 0, __ATOMIC_RELEASE);
    return count;
}
