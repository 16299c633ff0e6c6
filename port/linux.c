/* linux.c - the port contract (port/port.h) on Linux x86-64.
 *
 * Raw system calls for everything but what belongs to the C library: the thread-exit hook
 * (pthread_key_create, the only way to run code at the exit of a thread we did not create), the fork
 * hooks (pthread_atfork), errno and the environment (environ):
 * - reserve: mmap PROT_NONE (an inaccessible private mapping is not charged against the commit limit),
 *   over-sized by the alignment and trimmed at both ends, so nothing beyond the reservation stays mapped;
 *   commit: mprotect read/write, which charges it, so an impossible size is refused here as on
 *   Windows (with MAP_NORESERVE it would not be, and 64 TB "succeeded"); decommit:
 *   madvise(MADV_DONTNEED), which frees the pages and keeps the range read/write. Decommit does not
 *   change the protection because every protection change splits the kernel's list of mappings:
 *   decommitting every other free page of a large heap reached vm.max_map_count (65530) and then
 *   every mmap of the process failed. A decommitted range therefore reads zeros here rather than
 *   faulting as on Windows; the core never touches it before committing it again. It also keeps the
 *   kernel's commit charge (Committed_AS), which only falls at release: under strict overcommit
 *   (mode 2) the charge is the highest ever committed, while the statistics count what is committed
 *   now. release: munmap.
 * - large pages for segments and arenas (reserve_large_pages, from an offset on: SHARDMM_HUGE_PAGES and
 *   segment_large_from in the core say which, by default a heap's memory past its first segment and
 *   arena): a 2 MB transparent huge page forms only where a whole aligned 2 MB lies in one read/write
 *   mapping with the MADV_HUGEPAGE hint; the piecewise mprotect commits above split a segment into a
 *   mapping per committed run, so hinting alone changed nothing (issue 25). So such a reservation is
 *   committed whole at once: carved from a pool where the port keeps pools (below: read/write once
 *   claimed, and hinted or not as the reservation wants), else mmap PROT_NONE as any reservation, then one
 *   mprotect read/write of all of it, then the hint over its aligned 2 MB units. A commit inside it
 *   would be an mprotect to the protection the range already has: nothing changes (no split, no
 *   charge), yet each call takes the process's mapping lock, against the page faults of every other
 *   thread (2,000 of them in a run of bench/shapes.c's strings on 8 threads, 10 % of its time). So the
 *   port says PORT_LARGE_RESERVE_COMMITTED and the core makes none (segment.h: segment_commit). Decommit
 *   stays MADV_DONTNEED, which frees the 4 KB pages (a huge page under them is split) and keeps the
 *   mapping whole. Outside a pool the one mprotect charges the 4 MB as the piecewise commits charged
 *   their pieces, and under strict overcommit (mode 2, where there are no pools) it refuses when the 4 MB
 *   cannot be backed and the reservation fails (NULL) instead of a later fault: the contract holds, the
 *   charge only comes earlier, for the whole 4 MB rather than for what was committed. A pool's
 *   reservations are not charged (MAP_NORESERVE); the pools' section says why no check is lost. The cost is
 *   resident memory: the first touch of a hinted 2 MB makes all of it resident (and khugepaged may later
 *   fill a sparsely used one), so resident memory exceeds what the core committed, its statistics and
 *   shard_set_limit's limit, by up to 2 MB less a page per touched unit; bench/results/2026-12-01-thp.md
 *   (every segment) and 2026-12-02-huge-growth.md (the default) have what that does to peaks and times.
 *   The part below the offset becomes a mapping of its own (the hint splits it off), not hinted, until
 *   the core asks for large pages there too (collapse_large_pages: the hint and MADV_COLLAPSE, which the
 *   port weighs first against the faults it would save). The hint itself is weighed too: a new
 *   reservation's units are hinted while the last huge page made cost no more than twice the 4 KB
 *   faults it saves (huge_faults_pay below).
 * - pools: large blocks' reservations, and segments' and arenas' large-page ones, carved from 1 GB
 *   mappings made read/write as claims reach them (reserve_pooled, reserve_large_pages; see their
 *   section below).
 * - the heap slot: the core's initial-exec TLS word (PORT_SLOT_TLS); the exit hook is a pthread key,
 *   armed after the core stored the slot (pthread_setspecific may call calloc, which must find the heap
 *   there). With every key of the process taken there is no hook: the slot works, exits go unreported.
 * - unloading: the key's destructor is code of the module that holds the port (libshardmm.so, or a
 *   library of someone else's that links libshardmm.a in); had a dlclose unmapped it, every thread that
 *   allocated would call into nothing at its exit. So the module pins itself when it is loaded (a
 *   constructor: dlopen of itself with RTLD_NOLOAD | RTLD_NODELETE), as the static library pins its
 *   module on Windows: a dlclose leaves it loaded. glibc drops the fork hooks of a closed module itself;
 *   the program (or a static one) is never unloaded.
 * - threads: gettid, and tgkill with signal 0 to learn whether a thread id still lives.
 * - options: the C library's environ, the environment as the process has it when the allocator starts;
 *   where that is NULL (not set yet, or cleared), /proc/self/environ, the one it started with. The exit
 *   hook is a destructor of ours, which exit() runs after the program's atexit handlers.
 * - the clock: CLOCK_MONOTONIC_COARSE through the kernel's vDSO (a few loads, no system call), found
 *   once by reading /proc/self/auxv for the vDSO's address and its ELF symbol table for
 *   __vdso_clock_gettime; without it, the clock_gettime system call. It is read when a page is freed
 *   while a heap holds more than its 16 free pages: often enough in producer/consumer code to be worth
 *   it (bench/results/2026-11-30-quoted-in-code.md). The weighings of huge pages time faults by
 *   CLOCK_MONOTONIC the same way, and a collapse by its thread's CPU clock (a system call: the vDSO
 *   serves no CPU clock).
 * - symbolizing (the full-debug build's reports): dladdr, which glibc 2.34 and later keep in the C
 *   library itself (no libdl to link) and which allocates nothing: the module's path, and the nearest
 *   symbol of its dynamic symbol table (a program's own functions are there when it is linked with
 *   -rdynamic), else the offset from the module's start.
 */
#include "port.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>

enum {
    SYS_read = 0, SYS_write = 1, SYS_close = 3, SYS_mmap = 9, SYS_mprotect = 10, SYS_munmap = 11, SYS_rt_sigprocmask = 14,
    SYS_sched_yield = 24, SYS_mremap = 25, SYS_mincore = 27, SYS_madvise = 28, SYS_getpid = 39, SYS_kill = 62, SYS_gettid = 186,
    SYS_clock_gettime = 228, SYS_exit_group = 231, SYS_tgkill = 234, SYS_openat = 257, SYS_prlimit64 = 302,
    SYS_membarrier = 324
};
enum { PROT_NONE_ = 0, PROT_RW_ = 3 };
enum { MAP_PRIVATE_ = 0x02, MAP_ANONYMOUS_ = 0x20, MADV_DONTNEED_ = 4, MADV_HUGEPAGE_ = 14, MADV_NOHUGEPAGE_ = 15,
       MADV_POPULATE_WRITE_ = 23 };
#define LARGE_PAGE_ ((uintptr_t)2 << 20)
enum { CLOCK_MONOTONIC_ = 1, CLOCK_THREAD_CPUTIME_ID_ = 3, CLOCK_MONOTONIC_COARSE_ = 6, SIGABRT_ = 6, SIG_UNBLOCK_ = 1 };

static long sys6(long n, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}

static long sys3(long n, long a, long b, long c) { return sys6(n, a, b, c, 0, 0, 0); }

/* A system call failed when it returns a value in [-4095, -1]. */
static int sys_failed(long r) { return (unsigned long)r > (unsigned long)-4096L; }

static __thread int thread_exited __attribute__((tls_model("initial-exec"))); /* the exit hook has run */

static long map_none(uintptr_t hint, size_t size)
{
    return sys6(SYS_mmap, (long)hint, (long)size, PROT_NONE_, MAP_PRIVATE_ | MAP_ANONYMOUS_, -1, 0);
}

/* A mapping of exactly size bytes at `at`, or 0 (the hint is only a hint: the kernel may put it elsewhere). */
static uintptr_t map_at(uintptr_t at, size_t size)
{
    long r = map_none(at, size);
    if (sys_failed(r))
        return 0;
    if ((uintptr_t)r == at)
        return at;
    sys3(SYS_munmap, r, (long)size, 0);
    return 0;
}

/* A private anonymous mapping of size bytes at a multiple of align, with protection prot and the extra
 * flags; 0 when the kernel refuses. It maps align - 4 KB more than asked and unmaps what lies before the
 * first aligned address and after the mapping: the slack goes back at once. */
static uintptr_t map_aligned(size_t size, size_t align, long prot, long flags)
{
    long r = sys6(SYS_mmap, 0, (long)(size + align - PORT_PAGE), prot, MAP_PRIVATE_ | MAP_ANONYMOUS_ | flags, -1, 0);
    if (sys_failed(r))
        return 0;
    uintptr_t start = (uintptr_t)r, aligned = (start + align - 1) & ~(align - 1), end = start + size + align - PORT_PAGE;
    if (aligned > start)
        sys3(SYS_munmap, (long)start, (long)(aligned - start), 0);
    if (end > aligned + size)
        sys3(SYS_munmap, (long)(aligned + size), (long)(end - aligned - size), 0);
    return aligned;
}

void *port_reserve(size_t size, size_t align)
{
    uintptr_t aligned = map_aligned(size, align, PROT_NONE_, 0);
    if (aligned != 0)
        return (void *)aligned;
    /* No room for the slack (RLIMIT_AS almost reached): a mapping of the size alone, and if it is not
     * aligned, the aligned addresses just below and above it, where the kernel (which places mappings
     * from the top down) has usually left the space free. */
    long r = map_none(0, size);
    if (sys_failed(r))
        return NULL;
    uintptr_t start = (uintptr_t)r, down = start & ~(align - 1);
    if (start == down)
        return (void *)start;
    sys3(SYS_munmap, r, (long)size, 0);
    uintptr_t at = map_at(down, size);
    if (at == 0)
        at = map_at(down + align, size);
    return (void *)at;
}

/* The lower of RLIMIT_AS and RLIMIT_DATA, or SIZE_MAX. RLIMIT_DATA counts writable private mappings
 * only, which the headroom of a reservation is not; but a large block's commit up to its next 2 MB and
 * a pool's 1 GB read/write mapping are, and a 1.1 MB block counted 2 MB (test_hostile's data-limit): so
 * the core keeps to exact reservations under either. */
enum { RLIMIT_DATA_ = 2, RLIMIT_AS_ = 9 };

/* The current limit of a resource, SIZE_MAX for none (RLIM_INFINITY is all ones) or when it cannot be
 * read. One system call, which waits for no lock of the mappings. */
static size_t rlimit_now(int resource)
{
    uint64_t limit[2] = {0, 0}; /* current, maximum */
    return sys_failed(sys6(SYS_prlimit64, 0, resource, 0, (long)limit, 0, 0)) ? SIZE_MAX : (size_t)limit[0];
}

static size_t linux_address_space_limit(void)
{
    size_t as = rlimit_now(RLIMIT_AS_), data = rlimit_now(RLIMIT_DATA_);
    return as < data ? as : data;
}

/* ---- pools: reservations carved from bigger ones ------------------------------------------------------
 *
 * A large block's reservation of its own took five system calls (mmap over-sized, two munmaps of the
 * slack, the huge-page hint, the commit's mprotect), each taking the process's mapping lock while other
 * threads fault in their huge pages; mimalloc carves such blocks from 1 GB arenas mapped once
 * (bench/results/2026-12-03-pools.md). So reserve_pooled carves them from pools: 1 GB mappings, hinted
 * for huge pages when made, never given back. A segment's or an arena's large-page reservation took seven
 * (those five, and a page mapped and unmapped to learn whether new mappings are locked). Each waits for
 * the mapping lock behind every huge-page fault in progress, which zeroes its 2 MB holding the lock to
 * read, and while a writer waits no other thread's fault gets the lock: at rptest on 8 threads over 2
 * processors, threads slept so for tens of milliseconds while the others sent them blocks, and the peak
 * followed what waited in their inboxes (bench/results/2026-12-07-pooled-segments.md). So
 * reserve_large_pages carves them from pools too: a reservation hinted whole from a pool hinted when
 * made, one spared from large pages (its units hinted later, if ever: collapse_large_pages) from a plain
 * pool, made without the hint. A hint given inside a plain pool is marked per granule and taken back
 * (MADV_NOHUGEPAGE) when the granule is released, so that the next reservation spared there is spared
 * (under THP "always" such a granule then stays on small pages until it is hinted again).
 * A pool is mapped inaccessible and opened (made read/write) as claims reach it, ahead of them
 * (pool_open): mlockall's MCL_CURRENT makes every accessible page resident, and a pool read/write whole
 * made a process that locked its memory after its first large block hold 1 GB (test_hostile's
 * locked-memory). A pool is 8 words of 64 granules of 2 MB; a claim is a run of granules inside one word
 * (so at most 128 MB, at an alignment up to 128 MB, one CAS), a release (of a claim or a part of one:
 * PORT_RELEASE_PARTS) sets its pages free (MADV_DONTNEED: the range stays read/write), gives its
 * granules their pool's hint again where it differs, and then sets its granules free. A commit inside a
 * pool asks nothing of the kernel but a granule it covers only in part in a hinted pool, which it turns
 * to small pages (port_commit), and a hint asks nothing inside a hinted one but for such a granule.
 * What the pools give up: the charge. MAP_NORESERVE keeps a pool out of the kernel's commit charge, its
 * opening too, so a commit inside one is not checked against it. Pools exist only where that check could
 * refuse no claim: under heuristic overcommit (vm.overcommit_memory 0, which refuses a single mapping
 * larger than memory and swap together, far above 128 MB on any machine this serves) or none (1), not
 * under strict (2), and not under an address-space limit (RLIMIT_AS), where 1 GB of address space held
 * for nothing would count against it, nor while new mappings are locked (mlockall's MCL_FUTURE), under
 * which each opening would be made resident whole. A pool made before such a limit was set goes on
 * serving claims; under RLIMIT_DATA, which counts what is open, it then opens no further than a claim
 * and closes what a release gives back (data_limited). An impossible size still goes to port_reserve and
 * is refused there. Headroom in a pool reads zeros where a reservation of its own would fault: nothing of
 * ours touches it.
 * A move out of a pool (move_release) leaves the range mapped (MREMAP_DONTUNMAP, Linux 5.7; an older
 * kernel refuses the move and the core copies): a hole there would be free for another thread's mmap
 * until the pool had mapped it again. Pools are made one at a time, by the thread that finds the rest
 * of their kind full; threads that find another one making a pool wait for it. */
enum { POOL_GRANULE_SHIFT = 21, POOL_WORDS = 8, POOLS_MAX = 64, POOLS_FORKING = 2 };
#define POOL_WORD_SPAN ((size_t)64 << POOL_GRANULE_SHIFT)
#define POOL_SIZE (POOL_WORDS * POOL_WORD_SPAN)
enum { MAP_NORESERVE_ = 0x4000 };

static struct {
    uintptr_t base[POOLS_MAX];              /* aligned to POOL_WORD_SPAN */
    uint64_t used[POOLS_MAX][POOL_WORDS];   /* a bit per granule: claimed */
    uint64_t open[POOLS_MAX][POOL_WORDS];   /* a bit per granule: made read/write (by a claim, for good) */
    uint64_t turned[POOLS_MAX][POOL_WORDS]; /* a bit per granule whose hint differs from its pool's since
                                             * its claim: hinted in a plain pool, on small pages in a
                                             * hinted one (port_commit) */
    uint8_t plain[POOLS_MAX];               /* 1: made without the huge-page hint; set before count */
    int opening[POOLS_MAX];                 /* 1: a thread is opening part of it; POOLS_FORKING: a fork */
    unsigned count;                       /* pools made; base[i] is set before count passes i */
    int making;                           /* 1: a thread is making one; POOLS_FORKING: a fork holds them */
    int state;                            /* 0 not decided yet, 1 pools, -1 none */
} pools;

static size_t linux_address_space_limit(void);

/* The pool holding addr, or -1. */
static int pool_of(uintptr_t addr)
{
    unsigned n = __atomic_load_n(&pools.count, __ATOMIC_ACQUIRE);
    for (unsigned i = 0; i < n; i++)
        if (addr - pools.base[i] < POOL_SIZE)
            return (int)i;
    return -1;
}

/* 1 when a new writable mapping is made resident as it is made: mlockall's MCL_FUTURE (real-time
 * programs lock their memory so), under which a pool would be 1 GB of resident, locked memory at once
 * (test_hostile's locked-memory: 1,059 MB for a first 2 MB block). One page mapped, asked about, unmapped:
 * at each pool's making, for a process may lock its memory at any time. */
static int new_mappings_locked(void)
{
    long page = sys6(SYS_mmap, 0, PORT_PAGE, PROT_RW_, MAP_PRIVATE_ | MAP_ANONYMOUS_, -1, 0);
    if (sys_failed(page))
        return 1;
    unsigned char resident = 0;
    long r = sys3(SYS_mincore, page, PORT_PAGE, (long)&resident);
    sys3(SYS_munmap, page, PORT_PAGE, 0);
    return !sys_failed(r) && (resident & 1) != 0;
}

/* 1 when the process holds locked memory (VmLck of /proc/self/status is not 0), or that cannot be read.
 * Then mlockall's MCL_CURRENT may have locked a pool's addresses that no claim has opened yet, and a
 * claim opened there (pool_open) would be made resident whole, as a new mapping is under MCL_FUTURE; so a
 * segment or an arena is not carved from a pool then (linux_reserve_large_pages). Three system calls,
 * none of which waits for the mapping lock. */
static int memory_locked(void)
{
    char status[2048];
    long fd = sys6(SYS_openat, -100 /* AT_FDCWD */, (long)"/proc/self/status", 0x80000 /* O_RDONLY | O_CLOEXEC */,
                   0, 0, 0);
    if (sys_failed(fd))
        return 1;
    long n = sys3(SYS_read, fd, (long)status, (long)sizeof status - 1);
    sys3(SYS_close, fd, 0, 0);
    if (n <= 0)
        return 1;
    status[n] = 0;
    for (const char *line = status; *line != 0;) {
        if (line[0] == 'V' && line[1] == 'm' && line[2] == 'L' && line[3] == 'c' && line[4] == 'k' && line[5] == ':') {
            for (line += 6; *line == ' ' || *line == '\t'; line++)
                ;
            return !(line[0] == '0' && (line[1] == ' ' || line[1] == '\n'));
        }
        while (*line != 0 && *line++ != '\n')
            ;
    }
    return 1;
}

static int pools_allowed(void)
{
    int state = __atomic_load_n(&pools.state, __ATOMIC_RELAXED);
    if (state == 0) {
        char mode = '2';
        long fd = sys6(SYS_openat, -100 /* AT_FDCWD */, (long)"/proc/sys/vm/overcommit_memory",
                       0x80000 /* O_RDONLY | O_CLOEXEC */, 0, 0, 0);
        if (!sys_failed(fd)) {
            if (sys3(SYS_read, fd, (long)&mode, 1) != 1)
                mode = '2';
            sys3(SYS_close, fd, 0, 0);
        }
        state = mode == '0' || mode == '1' ? 1 : -1;
        __atomic_store_n(&pools.state, state, __ATOMIC_RELAXED);
    }
    return state > 0 && linux_address_space_limit() == SIZE_MAX && !new_mappings_locked();
}

/* A new pool (its index), or -1: none may be made now. While another thread makes one this one waits
 * (some thousand yields at most, should a fork's child ever find the flag of a maker it does not have:
 * the fork hooks below keep it from that) and looks at the pools again; -2 then. While a fork holds them
 * it is -1 at once, as the core's locks answer under a fork (sync.h): the forking thread's own prepare
 * handlers that run after ours, a child's handlers that run before ours, and the parent's other threads
 * take reservations of their own meanwhile (a segment's first block in a library's child handler waited
 * 4096 yields a fork: test_hostile's atfork_handlers_that_lock_free_and_collect). */
static int pool_make(unsigned seen, int plain)
{
    for (int tries = 0;; tries++) {
        int held = 0;
        if (__atomic_compare_exchange_n(&pools.making, &held, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            break;
        if (held == POOLS_FORKING || tries == 4096)
            return -1;
        sys3(SYS_sched_yield, 0, 0, 0);
    }
    if (__atomic_load_n(&pools.count, __ATOMIC_ACQUIRE) != seen) {
        __atomic_store_n(&pools.making, 0, __ATOMIC_RELEASE);
        return -2;
    }
    int made = -1;
    unsigned n = pools.count;
    if (n < POOLS_MAX && pools_allowed()) {
        uintptr_t base = map_aligned(POOL_SIZE, POOL_WORD_SPAN, PROT_NONE_, MAP_NORESERVE_);
        if (base != 0) {
            if (!plain)
                sys3(SYS_madvise, (long)base, (long)POOL_SIZE, MADV_HUGEPAGE_);
            pools.base[n] = base;
            pools.plain[n] = (uint8_t)plain;
            __atomic_store_n(&pools.count, n + 1, __ATOMIC_RELEASE);
            made = (int)n;
        }
    }
    __atomic_store_n(&pools.making, 0, __ATOMIC_RELEASE);
    return made;
}

/* The granules a reservation of size bytes takes, and the bits of a run of that many. */
static size_t granules_of(size_t size) { return (size + ((size_t)1 << POOL_GRANULE_SHIFT) - 1) >> POOL_GRANULE_SHIFT; }
static uint64_t run_of(size_t granules) { return granules == 64 ? ~(uint64_t)0 : ((uint64_t)1 << granules) - 1; }

/* The address of granule g (counted from the pool's start, across its words) of pool p. */
static uintptr_t granule_addr(int p, size_t g) { return pools.base[p] + (g << POOL_GRANULE_SHIFT); }

/* Claims `granules` aligned to `step` granules in pool p; the address or 0. */
static uintptr_t pool_claim(unsigned p, unsigned granules, unsigned step)
{
    uint64_t run = run_of(granules);
    for (unsigned w = 0; w < POOL_WORDS; w++) {
        uint64_t *word = &pools.used[p][w];
        uint64_t now = __atomic_load_n(word, __ATOMIC_RELAXED);
        for (unsigned at = 0; at + granules <= 64;) {
            uint64_t mask = run << at;
            if ((now & mask) != 0) {
                at += step;
                continue;
            }
            if (__atomic_compare_exchange_n(word, &now, now | mask, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
                return granule_addr((int)p, (size_t)w * 64 + at);
            /* now holds the word as it is: look at the same place again */
        }
    }
    return 0;
}

/* The bits of pool p's granules that [addr, addr+size) overlaps, in the word of its first granule (a
 * reservation's granules lie in one word); *word: that word's index. */
static uint64_t granule_bits(int p, uintptr_t addr, size_t size, unsigned *word)
{
    size_t first = (addr - pools.base[p]) >> POOL_GRANULE_SHIFT;
    size_t last = (addr + size - 1 - pools.base[p]) >> POOL_GRANULE_SHIFT;
    *word = (unsigned)(first / 64);
    return run_of(last - first + 1) << (first % 64);
}

/* 1 when RLIMIT_DATA bounds the process. It counts every writable private mapping, so a pool's granules
 * opened and given back again, and a pool made before the limit was set (a first segment made at
 * start-up, before a shell's `ulimit -d` or the program's own setrlimit) goes on serving claims: then
 * an opening reaches no further than its claim (pool_open) and a release closes what it gives back
 * (pool_release), so that what the limit counts of a pool is what is claimed (test_hostile's
 * data-limit: 64 MB blocks after 490 MB of small blocks were freed fitted 2-5 times under the limit,
 * not 6-8, while the host's huge pages were slow and segments were spared from a plain pool). RLIMIT_AS
 * counts a pool whole, open or not. */
static int data_limited(void) { return rlimit_now(RLIMIT_DATA_) != SIZE_MAX; }

/* Whether the granules `bits` of word w of pool p are open (read/write). */
static int granules_open(int p, unsigned w, uint64_t bits)
{
    return (__atomic_load_n(&pools.open[p][w], __ATOMIC_ACQUIRE) & bits) == bits;
}

/* Claim [r, r+size) of pool p made read/write where it is not yet: 1; or 0 when the kernel refuses, the
 * claim given back. A pool is mapped inaccessible, so that mlockall's MCL_CURRENT makes only what claims
 * opened resident, not the whole 1 GB (test_hostile's locked-memory: a process that locks its memory
 * after its first blocks). Opening is an mprotect that asks for no charge (the pool's MAP_NORESERVE), but
 * it waits for the mapping lock like any other, so an opening goes ahead of the claim: as far again as
 * the pool has open already (within the claim's word), so that a pool that grows to N granules opens in
 * about log2(N) calls and opens at most twice what was claimed; not while the process holds locked
 * memory, where what is opened becomes resident: then only the claim is opened, and a `strict` claim (a
 * segment's or an arena's, which the core commits piecewise outside a pool) is given back instead. */
/* Takes pool p's opening flag, which one thread at a time holds to open or close granules: 1; 0 when a
 * fork holds it (a child must not wait for a thread it does not have) or after 4096 yields; -1 when the
 * granules `bits` (not 0) of word w became open meanwhile, which is what the caller waited for. */
static int opening_take(int p, unsigned w, uint64_t bits)
{
    for (int tries = 0; tries < 4096; tries++) {
        int was = 0;
        if (__atomic_compare_exchange_n(&pools.opening[p], &was, 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return 1;
        if (was == POOLS_FORKING)
            return 0;
        if (bits != 0 && granules_open(p, w, bits))
            return -1;
        sys3(SYS_sched_yield, 0, 0, 0);
    }
    return 0;
}

static int pool_open(int p, uintptr_t r, size_t size, int strict)
{
    unsigned w;
    uint64_t bits = granule_bits(p, r, size, &w);
    if (granules_open(p, w, bits))
        return 1;
    /* One opening at a time: threads that claim side by side would each open ahead over the same
     * granules, and each opening waits for the mapping lock. Without the flag (a fork holds it, or a
     * long wait) the claim opens on its own. */
    int held = opening_take(p, w, bits);
    if (held < 0)
        return 1; /* the opening that held the flag reached this claim */
    int ok = granules_open(p, w, bits);
    if (!ok) {
        int locked = memory_locked();
        size_t first = (r - pools.base[p]) >> POOL_GRANULE_SHIFT, claimed = granules_of(size), n = claimed;
        size_t opened = 0;
        for (unsigned i = 0; i < POOL_WORDS; i++)
            opened += (size_t)__builtin_popcountll(__atomic_load_n(&pools.open[p][i], __ATOMIC_RELAXED));
        if (opened > n && !locked && !data_limited())
            n = opened < 64 - first % 64 ? opened : 64 - first % 64;
        if (!(locked && strict)) {
            ok = !sys_failed(sys3(SYS_mprotect, (long)r, (long)(n << POOL_GRANULE_SHIFT), PROT_RW_));
            if (!ok && n != claimed) { /* the claim alone, then */
                n = claimed;
                ok = !sys_failed(sys3(SYS_mprotect, (long)r, (long)(n << POOL_GRANULE_SHIFT), PROT_RW_));
            }
        }
        if (ok)
            __atomic_fetch_or(&pools.open[p][w], run_of(n) << (first % 64), __ATOMIC_RELEASE);
        else
            __atomic_fetch_and(&pools.used[p][w], ~bits, __ATOMIC_RELEASE);
    }
    if (held)
        __atomic_store_n(&pools.opening[p], 0, __ATOMIC_RELEASE);
    return ok;
}

/* A claim of size bytes at `align` in a pool of the kind asked for (plain: made without the hint), made
 * if none has room, opened (pool_open, `strict` as there); NULL when there are no pools or no new one may
 * be made. */
static void *pool_carve(size_t size, size_t align, int plain, int strict)
{
    size_t granules = granules_of(size), step = align >> POOL_GRANULE_SHIFT;
    if (granules > 64 || align > POOL_WORD_SPAN || __atomic_load_n(&pools.state, __ATOMIC_RELAXED) < 0)
        return NULL;
    if (step == 0)
        step = 1;
    unsigned n = __atomic_load_n(&pools.count, __ATOMIC_ACQUIRE);
    for (unsigned i = 0;;) {
        if (i == n) {
            int made = pool_make(n, plain);
            if (made == -1)
                return NULL;
            /* made, or another thread made one or more: look at them */
            n = made >= 0 ? (unsigned)made + 1 : __atomic_load_n(&pools.count, __ATOMIC_ACQUIRE);
        }
        uintptr_t r = pools.plain[i] == plain ? pool_claim(i, (unsigned)granules, (unsigned)step) : 0;
        if (r != 0)
            return pool_open((int)i, r, size, strict) ? (void *)r : NULL;
        i++;
    }
}

static void *linux_reserve_pooled(size_t size, size_t align) { return pool_carve(size, align, 0, 0); }

/* Closes (makes inaccessible again) the granules `bits` of word w of pool p, which a release gives back
 * (whole: under an address-space limit a reservation ends where its need does, inside its last granule),
 * holding the pool's opening flag so that no opening ahead crosses them meanwhile; a fork that holds the
 * flag leaves them open (harmless: only what RLIMIT_DATA counts stays higher). */
static void pool_close(int p, unsigned w, uint64_t bits)
{
    uintptr_t addr = granule_addr(p, (size_t)w * 64 + (size_t)__builtin_ctzll(bits));
    size_t size = (size_t)__builtin_popcountll(bits) << POOL_GRANULE_SHIFT;
    if (opening_take(p, w, 0) != 1)
        return;
    if (!sys_failed(sys3(SYS_mprotect, (long)addr, (long)size, PROT_NONE_)))
        __atomic_fetch_and(&pools.open[p][w], ~bits, __ATOMIC_RELEASE);
    __atomic_store_n(&pools.opening[p], 0, __ATOMIC_RELEASE);
}

/* Gives [addr, addr+size) of pool p back: its pages, its granules' hints as the pool has them again
 * (pool_turn_small), its granules' openings under RLIMIT_DATA (data_limited), then its granules. */
static void pool_release(int p, uintptr_t addr, size_t size)
{
    sys3(SYS_madvise, (long)addr, (long)size, MADV_DONTNEED_);
    unsigned w;
    uint64_t bits = granule_bits(p, addr, size, &w);
    if (data_limited())
        pool_close(p, w, bits);
    uint64_t turned = __atomic_fetch_and(&pools.turned[p][w], ~bits, __ATOMIC_RELAXED) & bits;
    for (unsigned g = 0; g < 64; g++)
        if (turned & ((uint64_t)1 << g))
            sys3(SYS_madvise, (long)granule_addr(p, (size_t)w * 64 + g), (long)((size_t)1 << POOL_GRANULE_SHIFT),
                 pools.plain[p] ? MADV_NOHUGEPAGE_ : MADV_HUGEPAGE_);
    __atomic_fetch_and(&pools.used[p][w], ~bits, __ATOMIC_RELEASE);
}

/* The granule of hinted pool p that holds addr goes on small pages (MADV_NOHUGEPAGE) until its release,
 * unless it has already. */
static void pool_turn_small(int p, uintptr_t addr)
{
    size_t g = (addr - pools.base[p]) >> POOL_GRANULE_SHIFT;
    uint64_t bit = (uint64_t)1 << (g % 64);
    if ((__atomic_fetch_or(&pools.turned[p][g / 64], bit, __ATOMIC_RELAXED) & bit) == 0)
        sys3(SYS_madvise, (long)granule_addr(p, g), (long)((size_t)1 << POOL_GRANULE_SHIFT), MADV_NOHUGEPAGE_);
}

/* Outside a pool a commit is an mprotect, which splits the mapping where it starts and ends, and a 2 MB
 * that straddles a split gets no huge page. Inside a hinted pool, where the range is read/write already,
 * a commit turns the granules it covers only in part to small pages, so that the first touch there
 * makes a page resident, not 2 MB: the core commits to within a 2 MB only where it wants that (a
 * created heap's large block, whose limit counts bytes; a far block's header page; large.c's
 * commit_end). The turn lasts until the granule's release (pool_release). */
int port_commit(void *addr, size_t size)
{
    int p = pool_of((uintptr_t)addr);
    if (p >= 0) {
        uintptr_t from = (uintptr_t)addr, to = from + size, granule = (uintptr_t)1 << POOL_GRANULE_SHIFT;
        if (!pools.plain[p] && size != 0) {
            if ((from & (granule - 1)) != 0)
                pool_turn_small(p, from);
            if ((to & (granule - 1)) != 0)
                pool_turn_small(p, to - 1);
        }
        return 0;
    }
    return sys_failed(sys3(SYS_mprotect, (long)addr, (long)size, PROT_RW_)) ? -1 : 0;
}

int port_decommit(void *addr, size_t size)
{
    return sys_failed(sys3(SYS_madvise, (long)addr, (long)size, MADV_DONTNEED_)) ? -1 : 0;
}

int port_release(void *addr, size_t size)
{
    int p = pool_of((uintptr_t)addr);
    if (p >= 0) {
        pool_release(p, (uintptr_t)addr, size);
        return 0;
    }
    return sys_failed(sys3(SYS_munmap, (long)addr, (long)size, 0)) ? -1 : 0;
}

static void linux_hint_large_pages(void *addr, size_t size)
{
    int p = pool_of((uintptr_t)addr);
    if (p >= 0) {
        unsigned w;
        uint64_t bits = granule_bits(p, (uintptr_t)addr, size, &w);
        if (!pools.plain[p]) { /* hinted when made: only granules a commit turned need it again */
            if ((__atomic_fetch_and(&pools.turned[p][w], ~bits, __ATOMIC_RELAXED) & bits) == 0)
                return;
        } else { /* taken back at the granules' release */
            __atomic_fetch_or(&pools.turned[p][w], bits, __ATOMIC_RELAXED);
        }
    }
    sys3(SYS_madvise, (long)addr, (long)size, MADV_HUGEPAGE_); /* a hint: a kernel without THP says no */
}

/* What a huge page costs is weighed against the 4 KB faults it saves, as the collapse below is, since it
 * differs by host and by phase. A huge page's first fault zeroes 2 MB: 0.24 ms on this project's hosts
 * when the memory was in use shortly before, against 0.69 ms for 512 faults of 4 KB. But a guest whose
 * hypervisor takes back the memory it frees in 2 MB blocks (virtio-balloon's free page reporting, as on
 * those Firecracker hosts) gets its huge pages from exactly those blocks, which the host backs again page
 * by page at their first touch: 5 ms each after a few seconds of quiet, while the 512 faults of 4 KB,
 * served from recently freed pages, still took 0.7 ms (bench/results/2026-12-05-hint-weighing.md: an
 * SQLite run spent 15 % of its time zeroing huge pages). So each reservation's first page, which the core
 * writes at once (a segment's or an arena's header), is faulted in when it is made, timed: a huge page's
 * cost where its unit was hinted, else a 4 KB page's (the second page's: the first fault also makes the
 * page table). The collapse's weighing times 4 KB faults too. A new reservation's units are hinted while
 * the last huge page cost at most HUGE_FAULT_WORTH times the faults of 512 pages (the factor for the TLB
 * misses a huge page saves), or while either is unknown. Passed over, the estimate drops (passed_over):
 * after a few, a hint is tried and timed again. */
#define HUGE_FAULT_WORTH 2
static uint64_t huge_fault_cost;  /* ns the last timed first fault of a hinted 2 MB took; 0: none yet */
static uint64_t small_fault_cost; /* ns the last timed fault of a 4 KB page took; 0: none yet */
static uint64_t clock_ns(int clock);

/* A weighing (the hint's, the collapse's) that went against huge pages leaves its estimate `was` of
 * their cost a quarter lower, so that a slow phase of the host is not taken for its nature. */
static void passed_over(uint64_t *estimate, uint64_t was)
{
    __atomic_store_n(estimate, was - was / 4, __ATOMIC_RELAXED);
}

/* The fault of the page at p, made now by MADV_POPULATE_WRITE (Linux 5.14) and timed, with one system
 * call's entry, which errs towards the hint: ns, at least 1; 0 when the kernel cannot. */
static uint64_t timed_fault(void *p)
{
    uint64_t t = clock_ns(CLOCK_MONOTONIC_);
    if (sys_failed(sys3(SYS_madvise, (long)p, PORT_PAGE, MADV_POPULATE_WRITE_)))
        return 0;
    uint64_t took = clock_ns(CLOCK_MONOTONIC_) - t;
    return took != 0 ? took : 1;
}

/* Pages about to be written, made resident by one MADV_POPULATE_WRITE rather than a fault each (when that
 * pays: src/small.c, carve_reach). A kernel older than 5.14 says EINVAL, once, and the port asks no more;
 * any other failure leaves the pages to their faults. */
static int populate_missing;

static void linux_populate(void *addr, size_t size)
{
    enum { EINVAL_ = 22 };
    if (__atomic_load_n(&populate_missing, __ATOMIC_RELAXED))
        return;
    if (sys3(SYS_madvise, (long)addr, (long)size, MADV_POPULATE_WRITE_) == -EINVAL_)
        __atomic_store_n(&populate_missing, 1, __ATOMIC_RELAXED);
}

/* mincore, 2 MB a call: what earned tails read at a probe's free (src/large.c). */
static size_t linux_resident_pages(void *addr, size_t size)
{
    enum { CHUNK = 512 };
    unsigned char present[CHUNK];
    size_t pages = size / PORT_PAGE, count = 0;
    for (size_t at = 0; at < pages; at += CHUNK) {
        size_t n = pages - at < CHUNK ? pages - at : CHUNK;
        long from = (long)((uint8_t *)addr + at * PORT_PAGE);
        if (sys_failed(sys3(SYS_mincore, from, (long)(n * PORT_PAGE), (long)present)))
            return SIZE_MAX;
        for (size_t i = 0; i < n; i++)
            count += present[i] & 1;
    }
    return count;
}

static int huge_faults_pay(void)
{
    uint64_t huge = __atomic_load_n(&huge_fault_cost, __ATOMIC_RELAXED);
    uint64_t small = __atomic_load_n(&small_fault_cost, __ATOMIC_RELAXED);
    if (huge == 0 || small == 0 || huge <= (uint64_t)HUGE_FAULT_WORTH * (LARGE_PAGE_ / PORT_PAGE) * small)
        return 1;
    passed_over(&huge_fault_cost, huge);
    return 0;
}

/* A reservation committed whole (the kernel charges it here, outside a pool) and hinted for huge pages
 * over its aligned 2 MB units from `from` on while they pay; its first page faulted in, timed. See the
 * top of the file. None while new mappings are locked (mlockall's MCL_FUTURE), nor from a pool while the
 * process holds locked memory where the claim would have to be opened (pool_open's `strict`): the whole
 * commit would make all of it resident and locked at once, a segment and an arena, 8 MB, for a thread's
 * first small and medium blocks (test_hostile's locked-memory), where the core's piecewise commits lock
 * what it commits. */
static void *linux_reserve_large_pages(size_t size, size_t align, size_t from_offset)
{
    /* From a pool where there are pools (see their section): a hinted one when all of it is to be hinted,
     * else a plain one. An alignment of 2 MB or more puts `from` on a unit boundary: weighed first. */
    int pay = -1;
    void *r = NULL;
    if (align >= LARGE_PAGE_ && (align & (align - 1)) == 0) {
        pay = ((from_offset + LARGE_PAGE_ - 1) & ~(LARGE_PAGE_ - 1)) < (size & ~(LARGE_PAGE_ - 1)) && huge_faults_pay();
        r = pool_carve(size, align, !(from_offset == 0 && pay), 1);
    }
    if (r == NULL) {
        if (new_mappings_locked())
            return NULL;
        r = port_reserve(size, align);
        if (r == NULL)
            return NULL;
        if (sys_failed(sys3(SYS_mprotect, (long)r, (long)size, PROT_RW_))) {
            sys3(SYS_munmap, (long)r, (long)size, 0);
            return NULL;
        }
    }
    uintptr_t from = ((uintptr_t)r + from_offset + LARGE_PAGE_ - 1) & ~(LARGE_PAGE_ - 1);
    uintptr_t to = ((uintptr_t)r + size) & ~(LARGE_PAGE_ - 1);
    int hinted = to > from && (pay >= 0 ? pay : huge_faults_pay());
    if (hinted)
        linux_hint_large_pages((void *)from, to - from);
    uint64_t took = timed_fault(r);
    if (took != 0 && hinted && from == (uintptr_t)r)
        __atomic_store_n(&huge_fault_cost, took, __ATOMIC_RELAXED);
    else if (took != 0 && (took = timed_fault((uint8_t *)r + PORT_PAGE)) != 0)
        __atomic_store_n(&small_fault_cost, took, __ATOMIC_RELAXED);
    return r;
}

/* The part of a reservation below its huge-page offset, committed, becomes huge pages now: the hint,
 * which joins it to the hinted mapping above when their flags then agree, and MADV_COLLAPSE (Linux 6.1),
 * which copies the 4 KB pages present into a new huge page and fills the rest with zeros. The hint
 * alone would not do: a 2 MB range that has a page table already takes 4 KB pages at its faults, until
 * khugepaged's scan (seconds to minutes). An older kernel says EINVAL to the collapse, and the pages
 * stay as they are.
 *
 * The collapse is a trade, and what it trades differs by machine: it saves the 4 KB faults of the
 * unit's pages not yet present (and TLB misses), and costs a new huge page, the copy, and the time it
 * holds the process's mapping lock. On one host a 4 KB fault took 10-16 us and a collapse 0.4-1 ms; on
 * another, whose hypervisor backs memory the guest gave back only when it is touched again, a 4 KB
 * fault took 1.6 us and a collapse 0.6-19 ms (bench/results/2026-12-04-collapse-cost.md). So each
 * unit's collapse is weighed first: mincore counts its pages not present, the first of them is faulted
 * in by MADV_POPULATE_WRITE (Linux 5.14; timed: what a fault costs here now, with one system call's
 * entry, which errs towards the collapse; the collapse would make the page present anyway, and it may
 * lie inside a block another thread is writing, which a write of ours could not touch safely), and the
 * collapse goes ahead when those faults would cost at least what collapses have been taking
 * (collapse_cost, the last one timed). Before any was timed, it goes ahead. A unit passed over lowers
 * the estimate (passed_over): after a few, the next collapse is timed again. The hint stays either way
 * (khugepaged's to do, later).
 *
 * A collapse is timed by the calling thread's CPU clock, as the faults it saves cost their thread's
 * processor: its wall time also holds its waits for the mapping lock and for every other processor to
 * drain its page lists, during which those processors run other threads. Under load the waits were most
 * of it (alloc-test at 8 threads on the AMD host's 2 vCPUs: 5-28 ms a collapse against 3.5-4.5 ms of
 * CPU), and the weighing passed over nearly every unit after the first three, whose 4 KB faults and TLB
 * misses the heap then kept (bench/results/2026-12-06-collapse-cpu.md). */
static uint64_t collapse_cost; /* ns of CPU the last timed collapse took; 0: none yet */

static int collapse_unit(uint8_t *unit)
{
    enum { MADV_COLLAPSE_ = 25, UNIT_PAGES = LARGE_PAGE_ / PORT_PAGE };
    uint64_t estimate = __atomic_load_n(&collapse_cost, __ATOMIC_RELAXED);
    if (estimate != 0) { /* weighed: the faults it would save against what collapses took */
        unsigned char present[UNIT_PAGES];
        uint8_t *first = NULL;
        unsigned missing = 0;
        uint64_t saves = 0;
        if (!sys_failed(sys3(SYS_mincore, (long)unit, LARGE_PAGE_, (long)present)))
            for (unsigned i = 0; i < UNIT_PAGES; i++)
                if ((present[i] & 1) == 0 && missing++ == 0)
                    first = unit + (size_t)i * PORT_PAGE;
        uint64_t fault = first != NULL ? timed_fault(first) : 0;
        if (fault != 0) {
            __atomic_store_n(&small_fault_cost, fault, __ATOMIC_RELAXED);
            saves = (uint64_t)(missing - 1) * fault;
        }
        if (saves < estimate) {
            passed_over(&collapse_cost, estimate);
            return 0;
        }
    }
    uint64_t t = clock_ns(CLOCK_THREAD_CPUTIME_ID_);
    long r = sys3(SYS_madvise, (long)unit, LARGE_PAGE_, MADV_COLLAPSE_);
    uint64_t took = clock_ns(CLOCK_THREAD_CPUTIME_ID_) - t;
    __atomic_store_n(&collapse_cost, took != 0 ? took : 1, __ATOMIC_RELAXED);
    return !sys_failed(r);
}

static int linux_collapse_large_pages(void *addr, size_t size)
{
    int all = 1;
    linux_hint_large_pages(addr, size);
    for (size_t at = 0; at + LARGE_PAGE_ <= size; at += LARGE_PAGE_)
        all &= collapse_unit((uint8_t *)addr + at);
    return all;
}

/* After a move of the whole granules [from, from+size) to `to`: the destination's granules, where they
 * lie in a pool, have the source's hint now (mremap moves a mapping with its flags), so their `turned`
 * bits say again whether that differs from their pool's, and their release sets it right. A source
 * outside a pool is a large block's, hinted. Read before the source's release clears its bits. */
static void pool_moved_hints(int p, uintptr_t from, size_t size, uintptr_t to)
{
    int q = pool_of(to);
    for (size_t off = 0; q >= 0 && off < size; off += (size_t)1 << POOL_GRANULE_SHIFT) {
        int hinted = 1;
        if (p >= 0) {
            size_t i = (from + off - pools.base[p]) >> POOL_GRANULE_SHIFT;
            hinted = !pools.plain[p] ^ (int)((__atomic_load_n(&pools.turned[p][i / 64], __ATOMIC_RELAXED) >> (i % 64)) & 1);
        }
        size_t j = (to + off - pools.base[q]) >> POOL_GRANULE_SHIFT;
        uint64_t bit = (uint64_t)1 << (j % 64);
        if (hinted != !pools.plain[q])
            __atomic_fetch_or(&pools.turned[q][j / 64], bit, __ATOMIC_RELAXED);
        else
            __atomic_fetch_and(&pools.turned[q][j / 64], ~bit, __ATOMIC_RELAXED);
    }
}

static int linux_move_release(void *reservation, size_t reservation_size, void *from, size_t size, void *to)
{
    enum { MREMAP_MAYMOVE_ = 1, MREMAP_FIXED_ = 2, MREMAP_DONTUNMAP_ = 4 };
    uintptr_t start = (uintptr_t)reservation, end = start + reservation_size, a = (uintptr_t)from;
    int p = pool_of(start); /* see the pools' section */
    long flags = MREMAP_MAYMOVE_ | MREMAP_FIXED_ | (p >= 0 ? MREMAP_DONTUNMAP_ : 0);
    long r = sys6(SYS_mremap, (long)from, (long)size, (long)size, flags, (long)to, 0);
    if (sys_failed(r))
        return -1;
    pool_moved_hints(p, a, size, (uintptr_t)to);
    if (p >= 0) {
        pool_release(p, start, reservation_size);
        return 0;
    }
    if (a > start)
        sys3(SYS_munmap, (long)start, (long)(a - start), 0);
    if (a + size < end)
        sys3(SYS_munmap, (long)(a + size), (long)(end - a - size), 0);
    return 0;
}

static pthread_key_t exit_key;
static int exit_key_made; /* 0: every key of the process was taken; no thread's exit is reported */
static void (*exit_fn)(void *heap);

static void key_destructor(void *heap)
{
    thread_exited = 1; /* glibc would call us again if the key were set again, but only for 4 rounds */
    exit_fn(heap);
}

/* At load, where the dynamic loader's lock is the loading thread's already: see "unloading" above. The
 * dlopen may allocate (the drop-in's own malloc then). A failure leaves no error for the program's
 * dlerror. */
__attribute__((constructor)) static void linux_pin_module(void)
{
    Dl_info info;
    if (dladdr((void *)key_destructor, &info) == 0 || info.dli_fname == NULL || info.dli_fname[0] == 0)
        return; /* a static program, or the program itself: never unloaded */
    if (dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE) == NULL)
        (void)dlerror();
}

static int linux_thread_exit_hook(void (*fn)(void *heap))
{
    exit_fn = fn;
    exit_key_made = pthread_key_create(&exit_key, key_destructor) == 0;
    return exit_key_made ? 0 : -1;
}

/* The core's fork hooks, with the pools' maker flag around them: a fork waits for a pool being made
 * (after the core's locks, which no maker holds), so that a child never finds the flag set by a thread
 * it does not have. Without that a child waited its 4096 yields for nothing, which on a loaded machine
 * took longer than test_hostile's 10 s (first_blocks_large_then_fork). */
static void (*core_prepare)(void), (*core_parent)(void), (*core_child)(void);

/* Flag (0 while free) held for a fork: once the thread that holds it lets it go. */
static void hold_for_fork(int *flag)
{
    for (int was = 0; !__atomic_compare_exchange_n(flag, &was, POOLS_FORKING, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED);
         was = 0)
        sys3(SYS_sched_yield, 0, 0, 0);
}

static void pools_fork_prepare(void)
{
    core_prepare();
    hold_for_fork(&pools.making);
    unsigned n = __atomic_load_n(&pools.count, __ATOMIC_ACQUIRE); /* no pool is made now */
    for (unsigned p = 0; p < n; p++)
        hold_for_fork(&pools.opening[p]);
}

/* After a fork, in the parent and the child: the pools are free to make and open again. */
static void pools_fork_release(void)
{
    unsigned n = __atomic_load_n(&pools.count, __ATOMIC_ACQUIRE);
    for (unsigned p = 0; p < n; p++)
        __atomic_store_n(&pools.opening[p], 0, __ATOMIC_RELEASE);
    __atomic_store_n(&pools.making, 0, __ATOMIC_RELEASE);
}

static void pools_fork_parent(void)
{
    pools_fork_release();
    core_parent();
}

static void pools_fork_child(void)
{
    pools_fork_release();
    core_child();
}

static int linux_fork_hooks(void (*prepare)(void), void (*parent)(void), void (*child)(void))
{
    core_prepare = prepare;
    core_parent = parent;
    core_child = child;
    return pthread_atfork(pools_fork_prepare, pools_fork_parent, pools_fork_child) == 0 ? 0 : -1;
}

static void linux_out_of_memory(void) { errno = ENOMEM; }

static void linux_invalid_argument(void) { errno = EINVAL; }

static int linux_thread_exit_arm(void *heap)
{
    if (thread_exited)
        return PORT_SLOT_EXITED;
    return !exit_key_made || pthread_setspecific(exit_key, heap) == 0 ? 0 : -1;
}

static uint32_t linux_thread_id(void) { return (uint32_t)sys3(SYS_gettid, 0, 0, 0); }

static int linux_thread_alive(uint32_t id)
{
    enum { ESRCH_ = 3 };
    /* Signal 0 to the thread of our process with that id: only the existence check is made. A thread that
     * has exited is gone from the process at once (threads are reaped by the kernel, not by a wait), so
     * ESRCH means no live thread has the id; any other answer (seccomp, say) counts as alive. */
    long r = sys3(SYS_tgkill, sys3(SYS_getpid, 0, 0, 0), (long)id, 0);
    return r == -ESRCH_ ? 0 : 1;
}

static uintptr_t linux_thread_tag(void) { return (uintptr_t)&thread_exited; /* a TLS address: the child keeps it */ }

/* ---- the clock ---------------------------------------------------------------------------------- */

typedef struct { long sec, nsec; } timespec_;
typedef int (*clock_gettime_fn)(int clock, timespec_ *ts);

/* ELF64 structures, as far as the vDSO lookup reads them. */
typedef struct { uint8_t ident[16]; uint16_t type, machine; uint32_t version; uint64_t entry, phoff, shoff;
                 uint32_t flags; uint16_t ehsize, phentsize, phnum, shentsize, shnum, shstrndx; } elf_ehdr;
typedef struct { uint32_t type, flags; uint64_t offset, vaddr, paddr, filesz, memsz, align; } elf_phdr;
typedef struct { int64_t tag; uint64_t val; } elf_dyn;
typedef struct { uint32_t name; uint8_t info, other; uint16_t shndx; uint64_t value, size; } elf_sym;
enum { AT_SYSINFO_EHDR_ = 33, PT_LOAD_ = 1, PT_DYNAMIC_ = 2, DT_HASH_ = 4, DT_STRTAB_ = 5, DT_SYMTAB_ = 6,
       STT_FUNC_ = 2 };

static uintptr_t vdso_base(void)
{
    uint64_t aux[2 * 64];
    long fd = sys6(SYS_openat, -100 /* AT_FDCWD */, (long)"/proc/self/auxv", 0x80000 /* O_RDONLY | O_CLOEXEC */,
                   0, 0, 0);
    if (sys_failed(fd))
        return 0;
    long n = sys3(SYS_read, fd, (long)aux, (long)sizeof aux);
    sys3(SYS_close, fd, 0, 0);
    for (long i = 0; !sys_failed(n) && i + 1 < n / 8; i += 2)
        if (aux[i] == AT_SYSINFO_EHDR_)
            return (uintptr_t)aux[i + 1];
    return 0;
}

static int same_name(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

/* __vdso_clock_gettime of the vDSO mapped at base, or NULL. */
static clock_gettime_fn vdso_clock(uintptr_t base)
{
    const elf_ehdr *eh = (const elf_ehdr *)base;
    if (base == 0 || eh->ident[0] != 0x7f || eh->ident[1] != 'E' || eh->ident[4] != 2 /* 64-bit */)
        return NULL;
    const elf_phdr *ph = (const elf_phdr *)(base + eh->phoff);
    uintptr_t bias = 0, dynamic = 0;
    int have_load = 0;
    for (unsigned i = 0; i < eh->phnum; i++) {
        if (ph[i].type == PT_LOAD_ && !have_load) {
            bias = base + ph[i].offset - ph[i].vaddr;
            have_load = 1;
        } else if (ph[i].type == PT_DYNAMIC_) {
            dynamic = ph[i].vaddr;
        }
    }
    if (!have_load || dynamic == 0)
        return NULL;
    const uint32_t *hash = NULL;
    const char *strtab = NULL;
    const elf_sym *symtab = NULL;
    for (const elf_dyn *d = (const elf_dyn *)(bias + dynamic); d->tag != 0; d++) {
        if (d->tag == DT_HASH_)
            hash = (const uint32_t *)(bias + d->val);
        else if (d->tag == DT_STRTAB_)
            strtab = (const char *)(bias + d->val);
        else if (d->tag == DT_SYMTAB_)
            symtab = (const elf_sym *)(bias + d->val);
    }
    if (hash == NULL || strtab == NULL || symtab == NULL)
        return NULL;
    for (uint32_t i = 0; i < hash[1]; i++) /* hash[1]: the number of symbols */
        if ((symtab[i].info & 0xf) == STT_FUNC_ && symtab[i].shndx != 0 &&
            same_name(strtab + symtab[i].name, "__vdso_clock_gettime"))
            return (clock_gettime_fn)(bias + symtab[i].value);
    return NULL;
}

static int clock_via_syscall(int clock, timespec_ *ts)
{
    return (int)sys3(SYS_clock_gettime, clock, (long)ts, 0);
}

static clock_gettime_fn clock_fn; /* set once; every thread that races to set it finds the same */

static timespec_ clock_read(int clock)
{
    clock_gettime_fn fn = __atomic_load_n(&clock_fn, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        fn = vdso_clock(vdso_base());
        if (fn == NULL)
            fn = clock_via_syscall;
        __atomic_store_n(&clock_fn, fn, __ATOMIC_RELEASE);
    }
    timespec_ ts = {0, 0};
    if (fn(clock, &ts) != 0)
        clock_via_syscall(clock, &ts);
    return ts;
}

static uint64_t linux_clock_ms(void)
{
    timespec_ ts = clock_read(CLOCK_MONOTONIC_COARSE_);
    return (uint64_t)ts.sec * 1000u + (uint64_t)ts.nsec / 1000000u;
}

/* A fine clock in nanoseconds, for the weighings of huge pages: CLOCK_MONOTONIC (also through the vDSO)
 * for faults, CLOCK_THREAD_CPUTIME_ID for a collapse. */
static uint64_t clock_ns(int clock)
{
    timespec_ ts = clock_read(clock);
    return (uint64_t)ts.sec * 1000000000u + (uint64_t)ts.nsec;
}

static void linux_yield(void) { sys3(SYS_sched_yield, 0, 0, 0); }

/* membarrier(2) (Linux 4.14): the private expedited command interrupts only the CPUs that run a thread
 * of this process, and needs the process registered first. A registration is kept across fork and
 * dropped by exec; one that is missing (EPERM) is made here, once, and the command tried again. A
 * kernel without it, or a filter that refuses it, gives -1. */
enum { MEMBARRIER_PRIVATE_EXPEDITED_ = 8, MEMBARRIER_REGISTER_PRIVATE_EXPEDITED_ = 16, EPERM_ = 1 };
static int linux_fence_all_threads(void)
{
    long r = sys3(SYS_membarrier, MEMBARRIER_PRIVATE_EXPEDITED_, 0, 0);
    if (r == -EPERM_ && sys3(SYS_membarrier, MEMBARRIER_REGISTER_PRIVATE_EXPEDITED_, 0, 0) == 0)
        r = sys3(SYS_membarrier, MEMBARRIER_PRIVATE_EXPEDITED_, 0, 0);
    return r == 0 ? 0 : -1;
}

/* ---- options and the process's end ----------------------------------------------------------- */

extern char **environ;

static size_t text_length(const char *s)
{
    size_t n = 0;
    while (s[n])
        n++;
    return n;
}

static int has_option_prefix(const char *s)
{
    static const char prefix[] = PORT_OPTION_PREFIX;
    for (size_t i = 0; i < sizeof prefix - 1; i++)
        if (s[i] != prefix[i])
            return 0;
    return 1;
}

/* The environment the process started with, from /proc/self/environ (entries ended by a zero byte),
 * read a piece at a time with raw system calls: where environ is not there (the C library has not set
 * it yet, or clearenv emptied it). An entry is gathered only while it can still be an option's. */
static void options_from_proc(void (*fn)(void *arg, const char *entry, size_t len), void *arg)
{
    static const char prefix[] = PORT_OPTION_PREFIX;
    enum { PREFIX_LEN = sizeof prefix - 1 };
    char piece[512], entry[PORT_OPTION_MAX];
    size_t n = 0; /* bytes of the current entry */
    int option = 1; /* it may be an option's: its bytes so far match the prefix */
    long fd = sys6(SYS_openat, -100 /* AT_FDCWD */, (long)"/proc/self/environ", 0x80000 /* O_RDONLY | O_CLOEXEC */,
                   0, 0, 0);
    if (sys_failed(fd))
        return;
    for (;;) {
        long got = sys3(SYS_read, fd, (long)piece, (long)sizeof piece);
        if (sys_failed(got) || got == 0)
            break;
        for (long i = 0; i < got; i++) {
            char c = piece[i];
            if (c != 0) {
                option = option && (n >= PREFIX_LEN || c == prefix[n]);
                if (option && n < PORT_OPTION_MAX)
                    entry[n] = c;
                n++;
                continue;
            }
            if (option && n >= PREFIX_LEN) {
                if (n > PORT_OPTION_MAX) { /* cut, and marked so (port.h) */
                    n = PORT_OPTION_MAX;
                    entry[n - 1] = '?';
                }
                fn(arg, entry, n);
            }
            n = 0;
            option = 1;
        }
    }
    sys3(SYS_close, fd, 0, 0);
}

static void linux_options(void (*fn)(void *arg, const char *entry, size_t len), void *arg)
{
    char **env = __atomic_load_n(&environ, __ATOMIC_RELAXED);
    if (env == NULL) {
        options_from_proc(fn, arg);
        return;
    }
    for (; *env != NULL; env++)
        if (has_option_prefix(*env))
            fn(arg, *env, text_length(*env));
}

static void (*exit_output)(void);

static int linux_process_exit_hook(void (*fn)(void))
{
    __atomic_store_n(&exit_output, fn, __ATOMIC_RELEASE);
    return 0;
}

/* exit() runs the destructors of the program and its libraries after its atexit handlers, each library
 * after those that depend on it: in the drop-in, after the program's own exit-time code. */
__attribute__((destructor)) static void linux_at_exit(void)
{
    void (*fn)(void) = __atomic_load_n(&exit_output, __ATOMIC_ACQUIRE);
    if (fn != NULL)
        fn();
}

/* buf[*n ...] = s, within size - 1 bytes. */
static void sym_append(char *buf, size_t size, size_t *n, const char *s)
{
    for (; *s != 0 && *n + 1 < size; s++)
        buf[(*n)++] = *s;
}

static void sym_append_hex(char *buf, size_t size, size_t *n, uintptr_t v)
{
    char digits[19] = "0x";
    int k = 0;
    char rev[16];
    do {
        rev[k++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v != 0);
    for (int i = 0; i < k; i++)
        digits[2 + i] = rev[k - 1 - i];
    digits[2 + k] = 0;
    sym_append(buf, size, n, digits);
}

/* "/path/module(function+0x1c)" or "/path/module+0x1234". */
static size_t linux_symbolize(const void *addr, char *buf, size_t size)
{
    Dl_info info;
    size_t n = 0;
    if (size == 0 || dladdr(addr, &info) == 0 || info.dli_fname == NULL || info.dli_fbase == NULL)
        return 0;
    sym_append(buf, size, &n, info.dli_fname);
    if (info.dli_sname != NULL && info.dli_saddr != NULL) {
        sym_append(buf, size, &n, "(");
        sym_append(buf, size, &n, info.dli_sname);
        sym_append(buf, size, &n, "+");
        sym_append_hex(buf, size, &n, (uintptr_t)addr - (uintptr_t)info.dli_saddr);
        sym_append(buf, size, &n, ")");
    } else {
        sym_append(buf, size, &n, "+");
        sym_append_hex(buf, size, &n, (uintptr_t)addr - (uintptr_t)info.dli_fbase);
    }
    buf[n] = 0;
    return n;
}

void port_write_error(const char *msg, size_t len)
{
    while (len > 0) {
        long r = sys3(SYS_write, 2, (long)msg, (long)len);
        if (sys_failed(r) || r == 0)
            return;
        msg += r;
        len -= (size_t)r;
    }
}

_Noreturn void port_abort(void)
{
    unsigned long mask = 1ul << (SIGABRT_ - 1);
    sys6(SYS_rt_sigprocmask, SIG_UNBLOCK_, (long)&mask, 0, 8, 0, 0);
    sys3(SYS_kill, sys3(SYS_getpid, 0, 0, 0), SIGABRT_, 0);
    for (;;)
        sys3(SYS_exit_group, 127, 0, 0);
}

port_capabilities port_caps = {
    .flags = PORT_DECOMMIT_KEEPS_CHARGE | PORT_LARGE_RESERVE_COMMITTED | PORT_RELEASE_PARTS,
    .move_release = linux_move_release,
    .reserve_pooled = linux_reserve_pooled,
    .hint_large_pages = linux_hint_large_pages,
    .reserve_large_pages = linux_reserve_large_pages,
    .collapse_large_pages = linux_collapse_large_pages,
    .populate = linux_populate,
    .resident_pages = linux_resident_pages,
    .address_space_limit = linux_address_space_limit,
    .clock_ms = linux_clock_ms,
    .yield = linux_yield,
    .fence_all_threads = linux_fence_all_threads,
    .thread_exit_hook = linux_thread_exit_hook,
    .thread_exit_arm = linux_thread_exit_arm,
    .thread_id = linux_thread_id,
    .thread_alive = linux_thread_alive,
    .fork_hooks = linux_fork_hooks,
    .thread_tag = linux_thread_tag,
    .out_of_memory = linux_out_of_memory,
    .invalid_argument = linux_invalid_argument,
    .options = linux_options,
    .process_exit_hook = linux_process_exit_hook,
    .symbolize = linux_symbolize,
};
