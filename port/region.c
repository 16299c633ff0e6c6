/* region.c - the port contract (port/port.h) over one region of memory the embedder hands over
 * (include/shardmm_region.h), with no operating system: every reservation, commit and decommit comes
 * out of that region. Freestanding like the core: it includes no C library header and calls nothing
 * but the embedder's callbacks.
 *
 * The region, from its first 64 KB boundary to its last, is G granules of 64 KB (PORT_RESERVE_ALIGN)
 * and 16 G pages of 4 KB. Its first granules hold its map, three bitmaps:
 *
 *   reserved    1 bit per granule: part of a reservation (the map's own granules are)
 *   committed   1 bit per page: committed now
 *   dirty       1 bit per page: may hold something other than zeros (it was committed once, or the
 *               region was not handed over zeroed)
 *
 * port_reserve finds the first run of free granules that starts at the asked alignment (first fit,
 * jumping past a reserved granule to the next aligned start). port_commit calls the embedder's commit
 * callback for each run of pages not yet committed and clears those that are dirty, since fresh memory
 * reads zero; a refusal takes back what the call committed. port_decommit and port_release give runs of
 * committed pages to the decommit callback; the pages stay dirty. Pages whose decommit is refused stay
 * committed; port_release zeroes them, since a later reservation of theirs is taken for fresh memory.
 * One spin lock guards the map (the callbacks run under it).
 *
 * Capabilities: a clock and yield if the embedder gives them, the region's size as the address-space
 * limit (so large blocks reserve what they need, without headroom), nothing else: no moving pages, no
 * large pages, no thread exit (threads call shard_thread_done), no thread numbers, no fork, no options (no
 * environment: every SHARDMM_ option keeps its default) and no process exit. The heap slot is the
 * embedder's (PORT_SLOT_FUNCTION): port_heap_slot_address asks its slot function, or gives the one word of
 * a single-threaded region; built with SHARD_SLOT=PORT_SLOT_GLOBAL the core keeps that word.
 */
#include "port.h"

#include "../include/shardmm_region.h"

enum { GRANULE_SHIFT = 16, PAGE_SHIFT_ = 12, PAGES_PER_GRANULE = 16 };
#define MIN_REGION ((size_t)256 << 10)

static struct {
    uint8_t *base; /* the first granule; NULL until shard_region_init */
    size_t granules;
    uint64_t *reserved, *committed_map, *dirty;
    shard_region_options opt;
    int lock;
    void *single_slot; /* the slot when the embedder gives no slot function */
} region;

/* ---- the lock ---------------------------------------------------------------------------------------- */

static void lock(void)
{
    while (__atomic_exchange_n(&region.lock, 1, __ATOMIC_ACQUIRE) != 0) {
        for (int i = 0; __atomic_load_n(&region.lock, __ATOMIC_RELAXED) != 0; i++) {
            __asm__ volatile("pause" ::: "memory");
            if (i >= 1000 && region.opt.yield != NULL) {
                region.opt.yield();
                i = 0;
            }
        }
    }
}

static void unlock(void) { __atomic_store_n(&region.lock, 0, __ATOMIC_RELEASE); }

/* ---- bitmaps ------------------------------------------------------------------------------------------ */

static int bit(const uint64_t *map, size_t i) { return (int)(map[i >> 6] >> (i & 63) & 1); }

/* Set (1) or clear (0) bits [from, to). */
static void set_bits(uint64_t *map, size_t from, size_t to, int value)
{
    while (from < to) {
        size_t n = to - from < 64 - (from & 63) ? to - from : 64 - (from & 63);
        uint64_t mask = (n == 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1) << (from & 63);
        if (value)
            map[from >> 6] |= mask;
        else
            map[from >> 6] &= ~mask;
        from += n;
    }
}

/* The first bit in [from, to) that is `value`, or `to`. */
static size_t find_bit(const uint64_t *map, size_t from, size_t to, int value)
{
    while (from < to) {
        uint64_t word = map[from >> 6] ^ (value ? 0 : ~(uint64_t)0);
        word &= ~(uint64_t)0 << (from & 63);
        if (word != 0) {
            size_t i = (from & ~(size_t)63) + (size_t)__builtin_ctzll(word);
            return i < to ? i : to;
        }
        from = (from & ~(size_t)63) + 64;
    }
    return to;
}

static void zero(void *addr, size_t size)
{
    uint64_t *p = addr, *end = (uint64_t *)((uint8_t *)addr + size);
    while (p < end) { /* a loop the compiler must not turn into a call to memset (-fno-builtin, core flags) */
        p[0] = 0, p[1] = 0, p[2] = 0, p[3] = 0, p[4] = 0, p[5] = 0, p[6] = 0, p[7] = 0;
        p += 8;
    }
}

/* ---- the map ------------------------------------------------------------------------------------------ */

static uint8_t *page_address(size_t page) { return region.base + (page << PAGE_SHIFT_); }

/* The pages of a range the core gives (inside the region, multiples of 4 KB), or 0 when it is not one. */
static int page_range(const void *addr, size_t size, size_t *first, size_t *end)
{
    uintptr_t a = (uintptr_t)addr, lo = (uintptr_t)region.base;
    size_t pages = region.granules * PAGES_PER_GRANULE;
    if (region.base == NULL || a < lo || ((a - lo) | size) & (PORT_PAGE - 1) || (a - lo) >> PAGE_SHIFT_ > pages ||
        size >> PAGE_SHIFT_ > pages - ((a - lo) >> PAGE_SHIFT_))
        return 0;
    *first = (a - lo) >> PAGE_SHIFT_;
    *end = *first + (size >> PAGE_SHIFT_);
    return 1;
}

/* Decommit the committed pages of [first, end): the callback for each run. 0, or -1 when it refused a
 * run (which stays committed; the runs before it are decommitted). */
static int decommit_pages(size_t first, size_t end)
{
    for (size_t i = find_bit(region.committed_map, first, end, 1); i < end;) {
        size_t run_end = find_bit(region.committed_map, i, end, 0);
        if (region.opt.decommit != NULL &&
            region.opt.decommit(page_address(i), (run_end - i) << PAGE_SHIFT_, region.opt.arg) != 0)
            return -1;
        set_bits(region.committed_map, i, run_end, 0);
        i = find_bit(region.committed_map, run_end, end, 1);
    }
    return 0;
}

/* Commit the uncommitted pages of [first, end), clearing the dirty ones. 0; -1 when the callback refused
 * a run (the runs it accepted before are decommitted again: nothing changes). */
static int commit_pages(size_t first, size_t end)
{
    if (region.opt.commit != NULL) {
        for (size_t i = find_bit(region.committed_map, first, end, 0); i < end;) {
            size_t run_end = find_bit(region.committed_map, i, end, 1);
            if (region.opt.commit(page_address(i), (run_end - i) << PAGE_SHIFT_, region.opt.arg) != 0) {
                for (size_t j = find_bit(region.committed_map, first, i, 0); j < i;) {
                    size_t back_end = find_bit(region.committed_map, j, i, 1);
                    if (region.opt.decommit != NULL)
                        region.opt.decommit(page_address(j), (back_end - j) << PAGE_SHIFT_, region.opt.arg);
                    j = find_bit(region.committed_map, back_end, i, 0);
                }
                return -1;
            }
            i = find_bit(region.committed_map, run_end, end, 0);
        }
    }
    for (size_t p = find_bit(region.committed_map, first, end, 0); p < end; p = find_bit(region.committed_map, p + 1, end, 0))
        if (bit(region.dirty, p))
            zero(page_address(p), PORT_PAGE);
    set_bits(region.committed_map, first, end, 1);
    set_bits(region.dirty, first, end, 1);
    return 0;
}

/* ---- the contract ------------------------------------------------------------------------------------- */

void *port_reserve(size_t size, size_t align)
{
    if (size == 0 || size & (PORT_RESERVE_ALIGN - 1) || align < PORT_RESERVE_ALIGN || (align & (align - 1)))
        return NULL;
    lock();
    void *result = NULL;
    size_t n = size >> GRANULE_SHIFT, g = region.granules;
    if (region.base != NULL && n <= g) {
        uintptr_t lo = (uintptr_t)region.base;
        size_t step = align >> GRANULE_SHIFT;
        /* The first granule at the alignment (the base is granule-aligned; align may not divide it). */
        uintptr_t first = (lo + align - 1) & ~(uintptr_t)(align - 1);
        size_t start = first >= lo ? (first - lo) >> GRANULE_SHIFT : g; /* g: an alignment past the end */
        while (start <= g - n) {
            size_t taken = find_bit(region.reserved, start, start + n, 1);
            if (taken == start + n) {
                set_bits(region.reserved, start, start + n, 1);
                result = region.base + (start << GRANULE_SHIFT);
                break;
            }
            start += ((taken - start) / step + 1) * step; /* the first aligned start past the reserved granule */
        }
    }
    unlock();
    return result;
}

int port_commit(void *addr, size_t size)
{
    size_t first, end;
    lock();
    int r = page_range(addr, size, &first, &end) ? commit_pages(first, end) : -1;
    unlock();
    return r;
}

int port_decommit(void *addr, size_t size)
{
    size_t first, end;
    lock();
    int r = page_range(addr, size, &first, &end) ? decommit_pages(first, end) : -1;
    unlock();
    return r;
}

int port_release(void *addr, size_t size)
{
    size_t first, end;
    lock();
    int r = -1;
    if (page_range(addr, size, &first, &end) && ((first | end) & (PAGES_PER_GRANULE - 1)) == 0) {
        /* The addresses go all the same. Pages whose decommit the embedder refused stay committed, and
         * commit_pages passes committed pages over: zeroed now, they read as fresh memory does for the
         * next reservation there. */
        if (decommit_pages(first, end) != 0)
            for (size_t p = find_bit(region.committed_map, first, end, 1); p < end;
                 p = find_bit(region.committed_map, p + 1, end, 1)) {
                zero(page_address(p), PORT_PAGE);
                set_bits(region.dirty, p, p + 1, 0);
            }
        set_bits(region.reserved, first / PAGES_PER_GRANULE, end / PAGES_PER_GRANULE, 0);
        r = 0;
    }
    unlock();
    return r;
}

void port_write_error(const char *msg, size_t len)
{
    if (region.opt.write_error != NULL)
        region.opt.write_error(msg, len);
}

_Noreturn void port_abort(void)
{
    if (region.opt.abort != NULL)
        region.opt.abort();
    for (;;)
        __builtin_trap();
}

static size_t region_address_space_limit(void) { return region.granules << GRANULE_SHIFT; }

port_capabilities port_caps = {
    .address_space_limit = region_address_space_limit,
};

#if SHARD_SLOT == PORT_SLOT_FUNCTION
void **port_heap_slot_address(void) { return region.opt.slot != NULL ? region.opt.slot() : &region.single_slot; }
#endif

/* ---- start ------------------------------------------------------------------------------------------- */

int shard_region_init(void *base, size_t size, const shard_region_options *options)
{
    static const shard_region_options defaults;
    const shard_region_options *o = options != NULL ? options : &defaults;
    uintptr_t lo = ((uintptr_t)base + PORT_RESERVE_ALIGN - 1) & ~(PORT_RESERVE_ALIGN - 1);
    uintptr_t hi = ((uintptr_t)base + size) & ~(PORT_RESERVE_ALIGN - 1);
    if ((uintptr_t)base + size < (uintptr_t)base || lo < (uintptr_t)base)
        hi = lo; /* wraps around the address space */
    if (hi < lo + MIN_REGION || (SHARD_SLOT != PORT_SLOT_FUNCTION && o->slot != NULL))
        return -1;
    if (__atomic_exchange_n(&region.lock, 1, __ATOMIC_ACQUIRE) != 0)
        return -1; /* the lock is someone else's: called twice at once, or after the region is in use */
    if (region.base != NULL) {
        unlock(); /* ours: called before */
        return -1;
    }
    size_t granules = (hi - lo) >> GRANULE_SHIFT, pages = granules * PAGES_PER_GRANULE;
    size_t granule_words = (granules + 63) / 64, page_words = (pages + 63) / 64;
    size_t map_bytes = 8 * (granule_words + 2 * page_words);
    size_t map_granules = (map_bytes + PORT_RESERVE_ALIGN - 1) >> GRANULE_SHIFT;
    size_t map_pages = (map_bytes + PORT_PAGE - 1) >> PAGE_SHIFT_;
    if (map_granules + 4 > granules || (o->commit != NULL && o->commit((void *)lo, map_pages << PAGE_SHIFT_, o->arg) != 0)) {
        unlock();
        return -1;
    }
    uint64_t *map = (uint64_t *)lo;
    if (!(o->flags & SHARD_REGION_ZEROED))
        zero(map, map_pages << PAGE_SHIFT_);
    region.opt = *o;
    region.granules = granules;
    region.reserved = map;
    region.committed_map = map + granule_words;
    region.dirty = region.committed_map + page_words;
    set_bits(region.reserved, 0, map_granules, 1);
    set_bits(region.committed_map, 0, map_pages, 1);
    set_bits(region.dirty, 0, (o->flags & SHARD_REGION_ZEROED) ? map_pages : pages, 1);
    port_caps.clock_ms = o->tick;
    port_caps.yield = o->yield;
    region.base = (uint8_t *)lo; /* last: port_reserve works from here on */
    unlock();
    return 0;
}
