/* test_port.c - the port contract (port/port.h), tested on its own: linked with the port's object file
 * only (port/linux.c or port/win64.c), no allocator.
 *
 * The capabilities (port_caps): each OS port offers the optional functions it claims, and its flags tell
 * what touching a decommitted range does (Linux: zeros; Windows: the range is reserved only).
 * Address space: reservations are aligned as asked with no slack left mapped around them, the
 * address-space limit is told, commit gives zeros and keeps contents when repeated,
 * decommit gives the memory back (zeros after the next commit; on Windows the range is no longer
 * committed), release takes a whole reservation; a large-page reservation (Linux) follows the same
 * contract and stays one mapping under piecewise commits and decommits. The exit hook: called once at the exit of every thread
 * that armed it, with the value it armed it for, and for no other thread. Windows' slot (the port's own,
 * PORT_SLOT_TEB): NULL in a thread until stored, then what was stored, per thread; the inline gs read
 * equals TlsGetValue of our index, and the slot is clear when the exit hook runs. The clock: monotonic, in milliseconds, and it advances across a
 * one-second sleep as the system's own monotonic clock does. Thread numbers: alive while the thread
 * runs, not after.
 *
 * Built with -DTEST_TLS_HIGH (Windows), the program takes 70 TLS indexes before the port takes its own,
 * so the port's index is 64 or above and every slot read goes through the TEB's expansion array.
 */
#define HARNESS_MAIN
#include "harness.h"
#include "platform.h"

#include "../port/port.h"

#ifndef _WIN32
#include <errno.h>
#include <sched.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <ucontext.h>

#include "seccomp.h"
#include "smaps.h"
#endif

#ifdef _WIN32
extern DWORD port_win64_tls_index;
#endif

enum { HOOK_THREADS = 6, MAX_RECORDS = 64 };

static struct {
    int calls;
    void *values[MAX_RECORDS];
    int slot_cleared[MAX_RECORDS];
} hook_calls;
static mutex_t hook_lock = MUTEX_INIT;

static void record_exit(void *heap)
{
    mutex_lock(&hook_lock);
    int i = hook_calls.calls++;
    if (i < MAX_RECORDS) {
        hook_calls.values[i] = heap;
#ifdef _WIN32
        hook_calls.slot_cleared[i] = port_heap_slot() == NULL;
#else
        hook_calls.slot_cleared[i] = 1; /* the slot is the core's (PORT_SLOT_TLS) */
#endif
    }
    mutex_unlock(&hook_lock);
}

/* Before anything: take the hook (and so, on Windows, the TLS index). */
__attribute__((constructor)) static void take_the_hook(void)
{
#ifdef TEST_TLS_HIGH
    for (int i = 0; i < 70; i++)
        if (TlsAlloc() == TLS_OUT_OF_INDEXES)
            break;
#endif
    if (port_caps.thread_exit_hook == NULL || port_caps.thread_exit_hook(record_exit) != 0) {
        fprintf(stderr, "port_caps.thread_exit_hook failed\n");
        exit(1);
    }
}

#ifdef _WIN32
#define WIN_ONLY(v) (v)
/* Windows' slot through the port's inline read, checked against the OS's own accessor. */
static void *slot_checked(void)
{
    void *v = port_heap_slot();
    void *os = TlsGetValue(port_win64_tls_index);
    CHECKF(v == os, "port_heap_slot %p, TlsGetValue(%lu) %p", v, (unsigned long)port_win64_tls_index, os);
    return v;
}

/* What the core does to take a heap: the slot, then the hook armed. */
static int slot_set(void *value)
{
    if (port_heap_slot_store(value) != 0)
        return -1;
    return port_caps.thread_exit_arm(value);
}
#else
#define WIN_ONLY(v) NULL
/* The slot is the core's; the port only arms the hook. */
static void *slot_checked(void) { return NULL; }
static int slot_set(void *value) { return port_caps.thread_exit_arm(value); }
#endif

/* Each OS port offers what it claims: Linux everything, Windows all but moving pages, large pages, an
 * address-space quota, fork and populating pages. */
TEST(the_capabilities_are_those_of_the_os)
{
    CHECK(port_caps.clock_ms != NULL && port_caps.yield != NULL && port_caps.thread_exit_hook != NULL &&
          port_caps.thread_exit_arm != NULL && port_caps.thread_id != NULL && port_caps.thread_alive != NULL &&
          port_caps.thread_tag != NULL && port_caps.out_of_memory != NULL && port_caps.invalid_argument != NULL);
#ifdef _WIN32
    CHECK_EQ(port_caps.flags, PORT_DECOMMIT_FAULTS);
    CHECK(port_caps.move_release == NULL && port_caps.hint_large_pages == NULL && port_caps.fork_hooks == NULL &&
          port_caps.address_space_limit == NULL && port_caps.reserve_large_pages == NULL &&
          port_caps.collapse_large_pages == NULL && port_caps.reserve_pooled == NULL && port_caps.populate == NULL &&
          port_caps.fence_all_threads == NULL);
#else
    CHECK_EQ(port_caps.flags, PORT_DECOMMIT_KEEPS_CHARGE | PORT_LARGE_RESERVE_COMMITTED | PORT_RELEASE_PARTS);
    CHECK(port_caps.move_release != NULL && port_caps.hint_large_pages != NULL && port_caps.fork_hooks != NULL &&
          port_caps.address_space_limit != NULL &&
          port_caps.reserve_large_pages != NULL && port_caps.collapse_large_pages != NULL &&
          port_caps.reserve_pooled != NULL && port_caps.populate != NULL && port_caps.fence_all_threads != NULL);
    errno = 0;
    port_caps.out_of_memory();
    CHECK_EQ(errno, ENOMEM);
    port_caps.invalid_argument();
    CHECK_EQ(errno, EINVAL);
#endif
}

TEST(reserve_commit_decommit_and_release_follow_the_contract)
{
    const size_t size = (size_t)8 << 20, off = (size_t)1 << 20, len = (size_t)256 << 10;
    unsigned char *r = port_reserve(size, PORT_RESERVE_ALIGN);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ((uintptr_t)r % PORT_RESERVE_ALIGN, 0);
    CHECK_EQ(port_commit(r + off, len), 0);
    CHECK_EQ(bytes_not_equal(r + off, len, 0), len);
    fill(r + off, len, 11);
    CHECK_EQ(port_commit(r + off, len), 0); /* committing again keeps the contents */
    CHECK(check_pattern(r + off, len, 11));
    CHECK_EQ(port_commit(r, PORT_PAGE), 0); /* the first and last pages of the reservation */
    CHECK_EQ(port_commit(r + size - PORT_PAGE, PORT_PAGE), 0);
    r[0] = 1;
    r[size - 1] = 2;
    static unsigned char last_page[4096];
    memcpy(last_page, r + off + len - PORT_PAGE, PORT_PAGE);
    CHECK_EQ(port_decommit(r + off + PORT_PAGE, len - 2 * PORT_PAGE), 0);
    CHECK(check_pattern(r + off, PORT_PAGE, 11)); /* the neighbours keep their contents */
    CHECK(memcmp(last_page, r + off + len - PORT_PAGE, PORT_PAGE) == 0);
#ifdef _WIN32
    MEMORY_BASIC_INFORMATION mi;
    CHECK(VirtualQuery(r + off + PORT_PAGE, &mi, sizeof mi) == sizeof mi);
    CHECKF(mi.State == MEM_RESERVE && mi.RegionSize == len - 2 * PORT_PAGE,
           "after decommit: state 0x%lx, region %zu bytes", (unsigned long)mi.State, (size_t)mi.RegionSize);
#endif
    if (!(port_caps.flags & PORT_DECOMMIT_FAULTS)) /* what the flags promise: zeros where it does not fault */
        CHECK_EQ(bytes_not_equal(r + off + PORT_PAGE, len - 2 * PORT_PAGE, 0), len - 2 * PORT_PAGE);
    CHECK_EQ(port_commit(r + off + PORT_PAGE, len - 2 * PORT_PAGE), 0);
    CHECK_EQ(bytes_not_equal(r + off + PORT_PAGE, len - 2 * PORT_PAGE, 0), len - 2 * PORT_PAGE);
    CHECK_EQ(r[0], 1);
    CHECK_EQ(r[size - 1], 2);
    CHECK_EQ(port_release(r, size), 0);
#ifdef _WIN32
    CHECK(VirtualQuery(r, &mi, sizeof mi) == sizeof mi);
    CHECKF(mi.State == MEM_FREE, "after release: state 0x%lx", (unsigned long)mi.State);
#endif
}

TEST(a_reservation_beyond_the_address_space_is_refused)
{
    CHECK(port_reserve((size_t)1 << 50, PORT_RESERVE_ALIGN) == NULL);
    CHECK(port_reserve((size_t)1 << 20, (size_t)1 << 50) == NULL);
    unsigned char *r = port_reserve((size_t)1 << 20, PORT_RESERVE_ALIGN);
    CHECK(r != NULL);
    if (r != NULL)
        CHECK_EQ(port_release(r, (size_t)1 << 20), 0);
}

/* The process's address space in use, bytes. */
static size_t address_space_now(void)
{
#ifdef _WIN32
    return 0; /* Windows: reserved_exactly asks VirtualQuery instead */
#else
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long pages = 0;
    if (f == NULL || fscanf(f, "%lu", &pages) != 1)
        pages = 0;
    if (f != NULL)
        fclose(f);
    return pages * 4096;
#endif
}

/* [lo, hi) is one reservation, and the address space grew by exactly its size when it was made
 * (`before`): no slack stays mapped around it. Windows: one allocation from lo, reserved, hi - lo long. */
static int reserved_exactly(uintptr_t lo, uintptr_t hi, size_t before)
{
#ifdef _WIN32
    (void)before;
    MEMORY_BASIC_INFORMATION mi;
    if (VirtualQuery((void *)lo, &mi, sizeof mi) != sizeof mi)
        return 0;
    return (uintptr_t)mi.AllocationBase == lo && mi.State == MEM_RESERVE && mi.RegionSize == hi - lo;
#else
    return address_space_now() - before == hi - lo;
#endif
}

/* Reservations at large alignments: aligned, exactly their size (no slack left mapped around them), whole
 * to release. Many, so that an unaligned first attempt is certain to happen on the way. */
TEST(aligned_reservations_hold_no_slack)
{
    static const size_t aligns[] = {(size_t)64 << 10, (size_t)4 << 20, (size_t)64 << 20, (size_t)1 << 30};
    static const size_t sizes[] = {(size_t)64 << 10, (size_t)1088 << 10, (size_t)4 << 20, (size_t)9 << 20};
    for (size_t i = 0; i < sizeof aligns / sizeof *aligns; i++) {
        for (size_t j = 0; j < sizeof sizes / sizeof *sizes; j++) {
            unsigned char *r[8];
            for (int k = 0; k < 8; k++) {
                size_t before = address_space_now();
                r[k] = port_reserve(sizes[j], aligns[i]);
                CHECKF(r[k] != NULL && (uintptr_t)r[k] % aligns[i] == 0, "reserve %zu at %zu: %p", sizes[j], aligns[i],
                       (void *)r[k]);
                if (r[k] != NULL)
                    CHECKF(reserved_exactly((uintptr_t)r[k], (uintptr_t)r[k] + sizes[j], before),
                           "reserve %zu at %zu: %p is not a reservation of exactly that size", sizes[j], aligns[i],
                           (void *)r[k]);
            }
            for (int k = 0; k < 8; k++)
                if (r[k] != NULL) {
                    CHECK_EQ(port_commit(r[k] + sizes[j] - PORT_PAGE, PORT_PAGE), 0);
                    r[k][sizes[j] - 1] = 1;
                    CHECK_EQ(port_release(r[k], sizes[j]), 0);
                }
        }
    }
}

#ifndef _WIN32
/* Under RLIMIT_AS the limit is told, and an aligned reservation still fits where only its own size (not
 * its slack) does. */
TEST(the_address_space_limit_is_told_and_a_tight_aligned_reservation_fits)
{
    CHECK_EQ(port_caps.address_space_limit(), SIZE_MAX);
    pid_t pid = fork();
    if (pid == 0) {
        FILE *f = fopen("/proc/self/statm", "r");
        unsigned long pages = 0;
        if (f == NULL || fscanf(f, "%lu", &pages) != 1)
            _exit(2);
        fclose(f);
        size_t vsz = pages * 4096, room = (size_t)6 << 20;
        struct rlimit rl = {vsz + room, vsz + room};
        if (setrlimit(RLIMIT_AS, &rl) != 0 || port_caps.address_space_limit() != vsz + room)
            _exit(3);
        void *r = port_reserve((size_t)5 << 20, (size_t)4 << 20); /* with its slack, 9 MB would not fit */
        _exit(r != NULL && (uintptr_t)r % ((size_t)4 << 20) == 0 ? 0 : 4);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x", status);
}
#endif

static void *thread_identity(void *arg)
{
    uint32_t *out = arg;
    out[0] = port_caps.thread_id();
    out[1] = port_caps.thread_alive(out[0]);
    uintptr_t tag = port_caps.thread_tag != NULL ? port_caps.thread_tag() : 1;
    out[2] = port_caps.thread_tag != NULL && (port_caps.thread_tag() != tag || tag == 0);
    memcpy(out + 4, &tag, sizeof tag);
    return NULL;
}

/* Thread numbers: each thread's own, never 0 or PORT_THREAD_NONE, alive while it runs and not after it
 * ended; the tag differs between threads and stays the same within one. */
TEST(thread_numbers_tell_live_threads_from_exited_ones)
{
    uint32_t me = port_caps.thread_id(), seen[4][8];
    uintptr_t tags[4];
    CHECK(me != 0 && me != PORT_THREAD_NONE);
    CHECK_EQ(port_caps.thread_alive(me), 1);
    CHECK_EQ(port_caps.thread_id(), me);
    for (int i = 0; i < 4; i++) {
        thread_t t;
        memset(seen[i], 0, sizeof seen[i]);
        CHECK_EQ(thread_start(&t, thread_identity, seen[i]), 0);
        thread_join(t);
        memcpy(&tags[i], seen[i] + 4, sizeof tags[i]);
        CHECK(seen[i][0] != 0 && seen[i][0] != PORT_THREAD_NONE && seen[i][0] != me);
        CHECK_EQ(seen[i][1], 1);
        CHECK_EQ(seen[i][2], 0);
        if (port_caps.thread_tag != NULL) /* every OS port has tags; an embedder's may not */
            CHECK(tags[i] != port_caps.thread_tag());
    }
    sleep_ms(50);
    for (int i = 0; i < 4; i++)
        CHECKF(port_caps.thread_alive(seen[i][0]) == 0, "thread %u ended but counts as alive", seen[i][0]);
    CHECK_EQ(port_caps.thread_alive(me), 1);
}

#ifndef _WIN32
/* Whether any mapping of the process overlaps [lo, hi), from /proc/self/maps. */
static int mapped_in(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return -1;
    unsigned long a, b;
    int found = 0;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a < hi && b > lo)
            found = 1;
    fclose(f);
    return found;
}

TEST(move_release_hands_pages_over_and_releases_the_rest_of_the_source)
{
    const size_t size = (size_t)8 << 20, off = (size_t)1 << 20, len = (size_t)2 << 20;
    unsigned char *from = port_reserve(size, PORT_RESERVE_ALIGN), *to = port_reserve(size, PORT_RESERVE_ALIGN);
    CHECK(from != NULL && to != NULL);
    if (from == NULL || to == NULL)
        return;
    CHECK_EQ(port_commit(from + off, len), 0);
    fill(from + off, len, 21);
    CHECK_EQ(port_commit(to + 6 * off, off), 0); /* a committed part of the target outside the move */
    fill(to + 6 * off, off, 22);
    port_caps.hint_large_pages(to, size); /* a hint: nothing visible changes */
    CHECK_EQ(port_caps.move_release(from, size, from + off, len, to), 0);
    CHECK(check_pattern(to, len, 21));
    CHECK(check_pattern(to + 6 * off, off, 22));
    CHECK_EQ(mapped_in((uintptr_t)from, (uintptr_t)from + size), 0);
    CHECK_EQ(port_commit(to + len, PORT_PAGE), 0); /* the rest of the target is still ours */
    CHECK_EQ(bytes_not_equal(to + len, PORT_PAGE, 0), PORT_PAGE);
    CHECK_EQ(port_release(to, size), 0);
    CHECK_EQ(mapped_in((uintptr_t)to, (uintptr_t)to + size), 0);
}

/* The mappings of the process that overlap [lo, hi), from /proc/self/maps; -1 when it cannot tell. */
static int mappings_in(uintptr_t lo, uintptr_t hi)
{
    FILE *f = fopen("/proc/self/maps", "r");
    if (f == NULL)
        return -1;
    unsigned long a, b;
    int n = 0;
    char line[512];
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "%lx-%lx", &a, &b) == 2 && a < hi && b > lo)
            n++;
    fclose(f);
    return n;
}

/* Whether the kernel's overcommit mode lets the port keep pools (0 or 1, not strict 2). */
static int pools_expected(void)
{
    FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
    int mode = f != NULL ? fgetc(f) : '2';
    if (f != NULL)
        fclose(f);
    return mode == '0' || mode == '1';
}

/* Four reserve_large_pages reservations of `size` with large pages from `from` on, each read zero, in
 * again[] (for large_pages_release_all); whether one of them is r (first fit: the addresses just
 * released, in a pool). */
static int large_pages_taken_again(const unsigned char *r, size_t size, size_t from, unsigned char *again[4])
{
    int found = 0;
    for (int i = 0; i < 4; i++) {
        again[i] = port_caps.reserve_large_pages(size, size, from);
        CHECK(again[i] != NULL);
        if (again[i] != NULL) {
            CHECK_EQ(bytes_not_equal(again[i], size, 0), size);
            found |= again[i] == r;
        }
    }
    return found;
}

static void large_pages_release_all(unsigned char *again[4], size_t size)
{
    for (int i = 0; i < 4; i++)
        if (again[i] != NULL)
            CHECK_EQ(port_release(again[i], size), 0);
}

/* Releases r, a reserve_large_pages reservation of `size` with large pages from `from` on, and checks
 * what became of it: gone from the process's mappings, or, where the port keeps pools (linux.c carves
 * these reservations from them), still mapped, and the same addresses, taken again, read zeros. */
static void large_page_release(unsigned char *r, size_t size, size_t from)
{
    CHECK_EQ(port_release(r, size), 0);
    if (!pools_expected()) {
        CHECK_EQ(mapped_in((uintptr_t)r, (uintptr_t)r + size), 0);
        return;
    }
    CHECK_EQ(mapped_in((uintptr_t)r, (uintptr_t)r + size), 1);
    unsigned char *again[4];
    int found = large_pages_taken_again(r, size, from, again);
    large_pages_release_all(again, size);
    CHECKF(found, "the addresses of a released large-page reservation (from %zu MB on) were not taken again",
           from >> 20);
}

/* A 2 MB huge page forms only inside one read/write mapping: committing and decommitting pieces of a
 * large-page reservation must keep it whole, with the contract's zeros and contents. With large pages
 * from an offset on, the part below it is a mapping of its own (no hint), at most `mappings` in all
 * (fewer where the kernel has no transparent huge pages and ignores the hint). */
static void large_page_reservation(size_t from, int mappings)
{
    const size_t size = (size_t)4 << 20, piece = (size_t)64 << 10;
    unsigned char *r = port_caps.reserve_large_pages(size, size, from);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ((uintptr_t)r % size, 0);
    for (size_t at = 0; at < size; at += 2 * piece) { /* every other piece, as small pages are taken */
        CHECK_EQ(port_commit(r + at, piece), 0);
        CHECK_EQ(bytes_not_equal(r + at, piece, 0), piece);
        fill(r + at, piece, 31);
    }
    CHECK_EQ(port_decommit(r + 2 * piece, piece), 0);
    CHECK_EQ(port_commit(r + 2 * piece, piece), 0);
    CHECK_EQ(bytes_not_equal(r + 2 * piece, piece, 0), piece); /* decommitted: zeros again */
    CHECK(check_pattern(r, piece, 31));                         /* its neighbours keep theirs */
    CHECK(check_pattern(r + 4 * piece, piece, 31));
    int n = mappings_in((uintptr_t)r, (uintptr_t)r + size);
    CHECKF(n >= 1 && n <= mappings, "the reservation is in %d mappings after piecewise commits, not %d", n, mappings);
    large_page_release(r, size, from);
}

TEST(a_large_page_reservation_follows_the_contract_as_one_mapping) { large_page_reservation(0, 1); }

TEST(a_large_page_reservation_from_2_mb_on_is_two_mappings_however_it_is_committed)
{
    large_page_reservation((size_t)2 << 20, 2);
}

/* PORT_LARGE_RESERVE_COMMITTED: the core commits nothing inside a large-page reservation, so all of it
 * must be usable as it comes, below the offset too, and again after a decommit (zeros). */
TEST(a_large_page_reservation_comes_committed_whole)
{
    if (!(port_caps.flags & PORT_LARGE_RESERVE_COMMITTED))
        return;
    const size_t size = (size_t)4 << 20, piece = (size_t)64 << 10;
    unsigned char *r = port_caps.reserve_large_pages(size, size, (size_t)2 << 20);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ(bytes_not_equal(r, size, 0), size);
    fill(r, 3 * piece, 41);
    fill(r + 3 * piece, piece, 42);
    fill(r + 4 * piece, size - 4 * piece, 41);
    CHECK_EQ(port_decommit(r + 3 * piece, piece), 0);
    CHECK_EQ(bytes_not_equal(r + 3 * piece, piece, 0), piece);
    fill(r + 3 * piece, piece, 43); /* no commit: still read/write */
    CHECK(check_pattern(r + 3 * piece, piece, 43));
    CHECK(check_pattern(r, 3 * piece, 41));
    CHECK(check_pattern(r + 4 * piece, size - 4 * piece, 41));
    CHECK_EQ(port_release(r, size), 0);
}

/* Whether this kernel faults pages in on request (MADV_POPULATE_WRITE, Linux 5.14). */
static int kernel_populates(void)
{
    char *r = mmap(NULL, PORT_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED)
        return 0;
    int ok = madvise(r, PORT_PAGE, 23 /* MADV_POPULATE_WRITE */) == 0;
    munmap(r, PORT_PAGE);
    return ok;
}

/* The Linux port faults a large-page reservation's first page in when it makes it, timed (linux.c weighs
 * the huge-page hint by what huge pages and 4 KB pages cost): the page the core writes at once, a
 * segment's or an arena's header. With no unit hinted, nothing else becomes resident but the second page
 * (the 4 KB fault it times), unless the kernel puts huge pages where it likes (THP "always"); hinted or
 * not, the reservation reads zeros. */
TEST(a_large_page_reservation_comes_with_its_first_page_faulted_in_and_little_more)
{
    const size_t size = (size_t)4 << 20;
    if (!kernel_populates())
        SKIP_TEST();
    for (size_t from = 0; from <= size; from += size) {
        unsigned char *r = port_caps.reserve_large_pages(size, size, from);
        CHECK(r != NULL);
        if (r == NULL)
            return;
        int first = 0;
        long n = resident_pages(r, size, &first);
        CHECKF(n >= 1 && first, "a reservation with large pages from %zu MB on: first page resident %d, %ld "
               "pages", from >> 20, first, n);
        if (from == size && huge_kb_over((uintptr_t)r, (uintptr_t)r + size, NULL) == 0)
            CHECKF(n <= 2, "a reservation with no unit hinted: %ld pages resident (2 at most expected)", n);
        CHECK_EQ(bytes_not_equal(r, size, 0), size);
        CHECK_EQ(port_release(r, size), 0);
    }
}

/* populate makes a committed range resident and changes nothing in it: what was written stays, the rest
 * reads zeros; a range it was never asked for stays as it was (unless the kernel put a huge page there
 * at the first write, as THP "always" may in the large-page reservation, committed whole). In a plain
 * reservation and in a large-page one's spared part (where the core asks for it). */
TEST(populate_makes_a_committed_range_resident_with_its_contents)
{
    const size_t size = (size_t)4 << 20, piece = (size_t)64 << 10;
    if (!kernel_populates())
        SKIP_TEST();
    CHECK(port_caps.populate != NULL);
    if (port_caps.populate == NULL)
        return;
    for (int large = 0; large <= 1; large++) {
        unsigned char *r = large ? port_caps.reserve_large_pages(size, size, size) : port_reserve(size, size);
        CHECK(r != NULL);
        if (r == NULL)
            return;
        unsigned char *at = r + 4 * piece;
        CHECK_EQ(port_commit(at, 2 * piece), 0);
        fill(at, PORT_PAGE, 61);
        port_caps.populate(at, piece);
        int first = 0;
        CHECKF(resident_pages(at, piece, &first) == (long)(piece / PORT_PAGE), "%s: %ld of %zu pages resident "
               "after populate", large ? "large-page reservation" : "reservation", resident_pages(at, piece, &first),
               piece / PORT_PAGE);
        if (huge_kb_over((uintptr_t)r, (uintptr_t)r + size, NULL) == 0)
            CHECKF(resident_pages(at + piece, piece, &first) == 0, "%s: pages resident beyond the range populated",
                   large ? "large-page reservation" : "reservation");
        CHECK(check_pattern(at, PORT_PAGE, 61));
        CHECK_EQ(bytes_not_equal(at + PORT_PAGE, 2 * piece - PORT_PAGE, 0), 2 * piece - PORT_PAGE);
        CHECK_EQ(port_release(r, size), 0);
    }
}

/* The part below the offset collapsed into large pages keeps the contract: what was written stays,
 * what was not reads zeros, a decommit there gives zeros again and leaves its neighbours' contents. */
TEST(the_part_below_a_large_page_offset_collapses_with_its_contents)
{
    const size_t size = (size_t)4 << 20, unit = (size_t)2 << 20, piece = (size_t)64 << 10;
    unsigned char *r = port_caps.reserve_large_pages(size, size, unit);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    for (size_t at = 0; at < unit; at += 2 * piece) {
        CHECK_EQ(port_commit(r + at, piece), 0);
        fill(r + at, piece, 37);
    }
    port_caps.collapse_large_pages(r, unit);
    for (size_t at = 0; at < unit; at += 2 * piece) {
        CHECKF(check_pattern(r + at, piece, 37), "piece at %zu KB after the collapse", at >> 10);
        CHECK_EQ(port_commit(r + at + piece, piece), 0);
        CHECK_EQ(bytes_not_equal(r + at + piece, piece, 0), piece);
    }
    CHECK_EQ(port_decommit(r + 2 * piece, piece), 0);
    CHECK_EQ(port_commit(r + 2 * piece, piece), 0);
    CHECK_EQ(bytes_not_equal(r + 2 * piece, piece, 0), piece);
    CHECK(check_pattern(r, piece, 37));
    CHECK(check_pattern(r + 4 * piece, piece, 37));
    large_page_release(r, size, unit);
}

/* A reservation spared from large pages comes from a pool made without the hint, where a hint given to a
 * unit makes that unit a mapping of its own with the hint (linux.c). Its release takes the hint back:
 * the next reservation spared at those addresses has none until it is hinted in turn, so a heap's first
 * segment stays on small pages whatever an earlier one there became. */
TEST(a_hint_given_inside_a_pool_goes_with_the_reservation)
{
    const size_t size = (size_t)4 << 20, unit = (size_t)2 << 20;
    if (!pools_expected())
        SKIP_TEST();
    unsigned char *r = port_caps.reserve_large_pages(size, size, size);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    int hinted = 0;
    huge_kb_over((uintptr_t)r, (uintptr_t)r + 1, &hinted);
    CHECKF(!hinted, "a reservation spared whole is hinted at %p", (void *)r);
    port_caps.hint_large_pages(r, unit);
    huge_kb_over((uintptr_t)r, (uintptr_t)r + 1, &hinted);
    if (!hinted) { /* a kernel without transparent huge pages takes no hint */
        CHECK_EQ(port_release(r, size), 0);
        SKIP_TEST();
    }
    huge_kb_over((uintptr_t)r + unit, (uintptr_t)r + unit + 1, &hinted);
    CHECKF(!hinted, "the hint of the lower unit at %p reached the upper one", (void *)r);
    CHECK_EQ(port_release(r, size), 0);
    unsigned char *again[4];
    int found = large_pages_taken_again(r, size, size, again);
    CHECKF(found, "the addresses of a released reservation at %p were not taken again", (void *)r);
    if (found) {
        huge_kb_over((uintptr_t)r, (uintptr_t)r + 1, &hinted);
        CHECKF(!hinted, "the addresses of a released hinted unit, taken again spared, are hinted at %p", (void *)r);
        port_caps.hint_large_pages(r, unit);
        huge_kb_over((uintptr_t)r, (uintptr_t)r + 1, &hinted);
        CHECKF(hinted, "a hint given again at %p did not take", (void *)r);
    }
    large_pages_release_all(again, size);
}

/* The Linux port weighs a collapse once it has timed one (linux.c: what the faults it saves would cost
 * against what a collapse costs): a 2 MB whose every page is present saves no fault, so it stays on
 * small pages, hinted; one with pages missing keeps what was written and reads zeros elsewhere, whether
 * it was collapsed or not (the weighing touches a missing page). */
TEST(a_collapse_that_would_save_no_fault_is_passed_over_once_one_was_timed)
{
    const size_t size = (size_t)4 << 20, unit = (size_t)2 << 20, piece = (size_t)64 << 10;
    if (!kernel_collapses())
        SKIP_TEST();
    unsigned char *timed = port_caps.reserve_large_pages(size, size, unit);
    CHECK(timed != NULL);
    if (timed == NULL)
        return;
    fill(timed, piece, 51);
    port_caps.collapse_large_pages(timed, unit); /* the first of the process is made and timed; later
                                                  * ones are weighed: either way one is timed by now */
    CHECK(check_pattern(timed, piece, 51));
    CHECK_EQ(port_release(timed, size), 0); /* gone before the others are made: a neighbour with a huge
                                             * page, hinted, would share their mapping, which smaps counts */
    unsigned char *full = port_caps.reserve_large_pages(size, size, unit);
    unsigned char *sparse = port_caps.reserve_large_pages(size, size, unit);
    CHECK(full != NULL && sparse != NULL);
    if (full == NULL || sparse == NULL)
        return;
    fill(full, unit, 52);
    CHECK_EQ(port_caps.collapse_large_pages(full, unit), 0);
    int hinted = 0;
    unsigned long kb = huge_kb_over((uintptr_t)full, (uintptr_t)full + unit, &hinted);
    CHECKF(kb == 0 && hinted, "a 2 MB with every page present: %lu KB of huge pages (0 expected), hinted %d", kb,
           hinted);
    CHECK(check_pattern(full, unit, 52));
    for (size_t at = 0; at < unit; at += 4 * piece)
        fill(sparse + at, piece, 53);
    port_caps.collapse_large_pages(sparse, unit);
    for (size_t at = 0; at < unit; at += 4 * piece) {
        CHECKF(check_pattern(sparse + at, piece, 53), "piece at %zu KB after the weighing", at >> 10);
        CHECK_EQ(bytes_not_equal(sparse + at + piece, 3 * piece, 0), 3 * piece);
    }
    CHECK_EQ(port_release(full, size), 0);
    CHECK_EQ(port_release(sparse, size), 0);
}

/* Whether four claims of size at align, each committed and read zero, include r (first fit: the
 * addresses just released, unless another test left room below them); the claims are released. */
static int claimed_again(const unsigned char *r, size_t size, size_t align)
{
    unsigned char *again[4];
    int found = 0;
    for (int i = 0; i < 4; i++) {
        again[i] = port_caps.reserve_pooled(size, align);
        CHECK(again[i] != NULL);
        if (again[i] == NULL)
            continue;
        CHECK_EQ(port_commit(again[i], size), 0);
        CHECK_EQ(bytes_not_equal(again[i], size, 0), size);
        found |= again[i] == r;
    }
    for (int i = 0; i < 4; i++)
        if (again[i] != NULL)
            CHECK_EQ(port_release(again[i], size), 0);
    return found;
}

/* A pooled reservation (large blocks') follows the contract of any: aligned, zeros after a commit,
 * contents kept, zeros after a decommit, and after its release the same addresses, taken again, read
 * zeros: nothing of its last use is left. Its addresses stay mapped (the pool's), read/write. Sizes
 * above 128 MB and alignments above it are not pooled (NULL: port_reserve takes them). */
TEST(a_pooled_reservation_follows_the_contract_and_comes_back_zeroed)
{
    if (!pools_expected())
        SKIP_TEST();
    const size_t size = (size_t)10 << 20, align = (size_t)4 << 20, piece = (size_t)64 << 10;
    unsigned char *r = port_caps.reserve_pooled(size, align);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ((uintptr_t)r % align, 0);
    CHECK_EQ(port_commit(r, size), 0);
    CHECK_EQ(bytes_not_equal(r, size, 0), size);
    fill(r, piece, 51);
    fill(r + piece, piece, 53);
    fill(r + 2 * piece, size - 2 * piece, 54);
    port_caps.hint_large_pages(r, size);
    CHECK_EQ(port_commit(r, size), 0);
    CHECK(check_pattern(r + piece, piece, 53));
    CHECK_EQ(port_decommit(r + piece, piece), 0);
    CHECK_EQ(bytes_not_equal(r + piece, piece, 0), piece);
    CHECK(check_pattern(r, piece, 51));
    CHECK(check_pattern(r + 2 * piece, size - 2 * piece, 54));
    fill(r, size, 52);
    CHECK_EQ(port_release(r, size), 0);
    CHECK_EQ(mapped_in((uintptr_t)r, (uintptr_t)r + size), 1);
    CHECK(claimed_again(r, size, align));
    unsigned char *big = port_caps.reserve_pooled((size_t)64 << 20, (size_t)64 << 20);
    CHECK(big != NULL && (uintptr_t)big % ((size_t)64 << 20) == 0);
    if (big != NULL)
        CHECK_EQ(port_release(big, (size_t)64 << 20), 0);
    CHECK(port_caps.reserve_pooled(((size_t)128 << 20) + PORT_RESERVE_ALIGN, align) == NULL);
    CHECK(port_caps.reserve_pooled(align, (size_t)256 << 20) == NULL);
}

/* The pages resident in the second 2 MB of r, a pooled reservation of size at align just given back,
 * once it is taken again (first fit: one of four claims), committed whole and touched there with `mark`
 * (its first 2 MB must read zeros); -1 when no claim was r. The claims are released. */
static long second_unit_again(unsigned char *r, size_t size, size_t align, unsigned char mark)
{
    const size_t unit = (size_t)2 << 20;
    unsigned char *again[4];
    long resident = -1;
    for (int i = 0; i < 4; i++) {
        again[i] = port_caps.reserve_pooled(size, align);
        CHECK(again[i] != NULL);
        if (again[i] != r)
            continue;
        CHECK_EQ(port_commit(r, size), 0);
        r[unit] = mark;
        int first;
        resident = resident_pages(r + unit, unit, &first);
        CHECK(bytes_not_equal(r, unit, 0) == unit && r[unit] == mark);
    }
    for (int i = 0; i < 4; i++)
        if (again[i] != NULL)
            CHECK_EQ(port_release(again[i], size), 0);
    return resident;
}

/* In a pool hinted for huge pages (large blocks'), a commit that ends inside a 2 MB leaves that 2 MB on
 * small pages, as its mprotect does outside a pool by splitting the mapping there: the first touch
 * makes one page resident, not 2 MB (large.c's commit_end says where the core wants that). The 2 MB
 * below, committed whole, is a huge page. The release gives the 2 MB its hint back: taken again and
 * committed whole, a touch there makes all of it resident. */
TEST(a_commit_that_ends_inside_a_large_page_of_a_pool_leaves_it_on_small_pages)
{
    const size_t size = (size_t)8 << 20, align = (size_t)4 << 20, unit = (size_t)2 << 20;
    const long unit_pages = (long)(unit / PORT_PAGE);
    if (!pools_expected() || !huge_pages_on())
        SKIP_TEST();
    unsigned char *r = port_caps.reserve_pooled(size, align);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ(port_commit(r, unit + PORT_PAGE), 0);
    r[0] = 61;
    r[unit] = 62;
    int first;
    long below = resident_pages(r, unit, &first), above = resident_pages(r + unit, unit, &first);
    CHECKF(below == unit_pages, "the 2 MB committed whole: %ld pages resident after one touch (a huge page, %ld, "
           "expected)", below, unit_pages);
    CHECKF(above == 1, "the 2 MB the commit ends in: %ld pages resident after one touch, 1 expected", above);
    CHECK(r[0] == 61 && r[unit] == 62);
    CHECK_EQ(port_release(r, size), 0);
    above = second_unit_again(r, size, align, 63);
    CHECKF(above == unit_pages, "the 2 MB a commit ended in, released, taken again and committed whole: %ld pages "
           "resident after one touch, %ld expected (-1: the addresses were not taken again)", above, unit_pages);
}

/* A move out of a pool into a pool carries a 2 MB on small pages with it (mremap moves the mapping with
 * its flags), and the destination's release gives it the pool's hint back all the same: its addresses,
 * taken again and committed whole, make all of a touched 2 MB resident. */
TEST(a_2mb_on_small_pages_moved_within_the_pools_gets_its_hint_back_at_the_release)
{
    const size_t size = (size_t)8 << 20, align = (size_t)4 << 20, unit = (size_t)2 << 20;
    const long unit_pages = (long)(unit / PORT_PAGE);
    if (!pools_expected() || !huge_pages_on() || port_caps.move_release == NULL)
        SKIP_TEST();
    unsigned char *src = port_caps.reserve_pooled(size, align), *dst = port_caps.reserve_pooled(size, align);
    CHECK(src != NULL && dst != NULL);
    if (src == NULL || dst == NULL)
        return;
    CHECK_EQ(port_commit(src, unit + PORT_PAGE), 0); /* its second 2 MB on small pages */
    CHECK_EQ(port_commit(src + unit + PORT_PAGE, unit - PORT_PAGE), 0);
    fill(src, 2 * unit, 81);
    CHECK_EQ(port_commit(dst, size), 0);
    CHECK_EQ(port_caps.move_release(src, size, src, 2 * unit, dst), 0);
    CHECK(check_pattern(dst, 2 * unit, 81));
    CHECK_EQ(port_release(dst, size), 0);
    long above = second_unit_again(dst, size, align, 82);
    CHECKF(above == unit_pages, "a 2 MB moved there on small pages, released, taken again and committed whole: "
           "%ld pages resident after one touch, %ld expected (-1: the addresses were not taken again)", above,
           unit_pages);
}

/* VmData of /proc/self/status (what RLIMIT_DATA counts), KB; -1 when it cannot be read. */
static long vm_data_kb(void)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = -1;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (strncmp(line, "VmData:", 7) == 0)
            kb = atol(line + 7);
    if (f != NULL)
        fclose(f);
    return kb;
}

/* RLIMIT_DATA counts every writable private mapping, and a pool made before the limit was set (a
 * process's first segment comes before a shell's `ulimit -d`) goes on serving claims: under the limit a
 * reservation given back is closed again, so that what the limit counts of a pool is what is claimed
 * (test_hostile's data-limit). Taken again it is opened, reads zeros and keeps what is written. In a
 * child, whose limit goes with it. */
TEST(under_a_data_limit_a_pooled_reservation_given_back_stops_counting)
{
    if (!pools_expected())
        SKIP_TEST();
    const size_t size = (size_t)64 << 20, align = (size_t)4 << 20;
    pid_t pid = fork();
    if (pid == 0) {
        unsigned char *r = port_caps.reserve_pooled(size, align); /* the pool is there before the limit */
        if (r == NULL || port_commit(r, size) != 0)
            _exit(2);
        fill(r, size, 71);
        port_release(r, size);
        struct rlimit rl;
        if (getrlimit(RLIMIT_DATA, &rl) != 0)
            _exit(3);
        rl.rlim_cur = (rlim_t)64 << 30;
        if (setrlimit(RLIMIT_DATA, &rl) != 0)
            _exit(3);
        unsigned char *again = port_caps.reserve_pooled(size, align);
        if (again == NULL || port_commit(again, size) != 0)
            _exit(4);
        if (bytes_not_equal(again, size, 0) != size)
            _exit(5);
        fill(again, size, 72);
        if (!check_pattern(again, size, 72))
            _exit(5);
        long held = vm_data_kb();
        port_release(again, size);
        long after = vm_data_kb();
        fprintf(stderr, "VmData with 64 MB claimed under the limit: %ld KB, given back: %ld KB\n", held, after);
        _exit(held >= 0 && after >= 0 && held - after >= (long)(size >> 10) ? 0 : 6);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    CHECKF(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status 0x%x (2, 4: no reservation; 3: no limit; "
           "5: contents; 6: VmData did not fall by 64 MB at the release)", status);
}

/* A move out of a pool leaves the source's addresses mapped: between the move and the release another
 * thread's mmap must not find a hole there, which the pool would map over (test_fork's checks caught
 * a segment made in one). The pages arrive whole, the rest of the source is given back. */
TEST(a_move_out_of_a_pool_leaves_no_hole_and_gives_the_source_back)
{
    if (!pools_expected())
        SKIP_TEST();
    const size_t size = (size_t)12 << 20, off = (size_t)2 << 20, len = (size_t)4 << 20;
    unsigned char *from = port_caps.reserve_pooled(size, (size_t)4 << 20);
    unsigned char *to = port_reserve(size, PORT_RESERVE_ALIGN);
    CHECK(from != NULL && to != NULL);
    if (from == NULL || to == NULL)
        return;
    CHECK_EQ(port_commit(from, size), 0);
    fill(from, size, 61);
    fill(from + off, len, 62);
    CHECK_EQ(port_caps.move_release(from, size, from + off, len, to), 0);
    CHECK(check_pattern(to, len, 62));
    CHECK_EQ(mapped_in((uintptr_t)from + off, (uintptr_t)from + off + len), 1);
    unsigned char *again = port_caps.reserve_pooled(size, (size_t)4 << 20);
    CHECK(again != NULL);
    if (again != NULL) {
        CHECK_EQ(port_commit(again, size), 0);
        CHECK_EQ(bytes_not_equal(again, size, 0), size);
        CHECK_EQ(port_release(again, size), 0);
    }
    CHECK_EQ(port_release(to, size), 0);
}

/* Threads claiming and releasing pooled reservations at once never get overlapping ones: each writes
 * its own pattern over its claims and finds it intact before it releases them. */
enum { POOL_THREADS = 4, POOL_CLAIMS = 12, POOL_ROUNDS = 20 };

static void *pool_thread(void *arg)
{
    unsigned seed = (unsigned)(uintptr_t)arg;
    for (int round = 0; round < POOL_ROUNDS; round++) {
        unsigned char *r[POOL_CLAIMS];
        size_t size[POOL_CLAIMS];
        for (int i = 0; i < POOL_CLAIMS; i++) {
            size[i] = (size_t)(2 + (seed * 7 + (unsigned)i * 13 + (unsigned)round) % 30) << 20;
            r[i] = port_caps.reserve_pooled(size[i], (size_t)4 << 20);
            if (r[i] == NULL)
                r[i] = port_reserve(size[i], (size_t)4 << 20);
            CHECK(r[i] != NULL);
            if (r[i] == NULL)
                return NULL;
            CHECK_EQ(port_commit(r[i], size[i]), 0);
            for (size_t at = 0; at < size[i]; at += PORT_PAGE) /* a word per page: the claim is ours */
                ((uint32_t *)(r[i] + at))[0] = seed << 16 | (unsigned)i;
        }
        for (int i = 0; i < POOL_CLAIMS; i++) {
            size_t bad = 0;
            for (size_t at = 0; at < size[i]; at += PORT_PAGE)
                bad += ((uint32_t *)(r[i] + at))[0] != (seed << 16 | (unsigned)i);
            CHECKF(bad == 0, "thread %u: %zu pages of its claim of %zu MB were overwritten", seed, bad, size[i] >> 20);
            CHECK_EQ(port_release(r[i], size[i]), 0);
        }
    }
    return NULL;
}

/* Where the port says so (PORT_RELEASE_PARTS), parts of a reservation on 4 MB boundaries are released
 * apart, and neighbouring parts as one: the rest keeps its contents; an own reservation's part is gone
 * from the process's mappings, a pool's comes back to the next claims (first fit) and reads zero. */
static void release_parts(int pooled)
{
    const size_t part = (size_t)4 << 20, size = 4 * part;
    unsigned char *r = pooled ? port_caps.reserve_pooled(size, part) : port_reserve(size, part);
    CHECK(r != NULL);
    if (r == NULL)
        return;
    CHECK_EQ(port_commit(r, size), 0);
    for (int i = 0; i < 4; i++)
        fill(r + i * part, part, 60 + i);
    CHECK_EQ(port_release(r + part, part), 0); /* the second part alone */
    CHECK(check_pattern(r, part, 60));
    CHECK(check_pattern(r + 2 * part, part, 62));
    CHECK(check_pattern(r + 3 * part, part, 63));
    if (!pooled)
        CHECK_EQ(mapped_in((uintptr_t)r + part, (uintptr_t)r + 2 * part), 0);
    CHECK_EQ(port_release(r + 2 * part, 2 * part), 0); /* the third and fourth as one */
    CHECK(check_pattern(r, part, 60));
    if (!pooled)
        CHECK_EQ(mapped_in((uintptr_t)r + part, (uintptr_t)r + size), 0);
    CHECK_EQ(port_release(r, part), 0);
    if (!pooled) {
        CHECK_EQ(mapped_in((uintptr_t)r, (uintptr_t)r + size), 0);
        return;
    }
    CHECKF(claimed_again(r, size, part), "the released parts at %p were not claimed again", (void *)r);
}

TEST(parts_of_a_reservation_are_released_apart_and_together)
{
    if (!(port_caps.flags & PORT_RELEASE_PARTS))
        SKIP_TEST();
    release_parts(0);
}

TEST(parts_of_a_pooled_reservation_are_released_apart_and_together)
{
    if (!(port_caps.flags & PORT_RELEASE_PARTS) || !pools_expected())
        SKIP_TEST();
    release_parts(1);
}

TEST(pooled_reservations_taken_by_threads_at_once_never_overlap)
{
    if (!pools_expected())
        SKIP_TEST();
    thread_t t[POOL_THREADS];
    for (unsigned i = 0; i < POOL_THREADS; i++)
        CHECK_EQ(thread_start(&t[i], pool_thread, (void *)(uintptr_t)(i + 1)), 0);
    for (unsigned i = 0; i < POOL_THREADS; i++)
        thread_join(t[i]);
}

/* A fork while another thread makes a pool (test_hostile's first_blocks_large_then_fork failed once in
 * CI on it): the port's fork hooks wait for the maker, so the child never finds the maker's flag set by
 * a thread it does not have. Here the maker's mmap of the new pool is held up: a seccomp filter of the
 * maker thread's own traps it (SIGSYS), and the handler waits for the test before it makes the call
 * itself (with MAP_NONBLOCK, which the filter lets through and which changes nothing without
 * MAP_POPULATE). Meanwhile another thread forks; the child then takes a pooled reservation. Without the
 * wait it found the flag set and gave up after its 4096 yields: NULL. */
static int pool_trap_held, pool_trap_go; /* held: 1 in the trap, -1 no filter, -2 no pool made */

static void pool_trap(int sig, siginfo_t *info, void *context)
{
    (void)sig;
    (void)info;
    greg_t *r = ((ucontext_t *)context)->uc_mcontext.gregs;
    __atomic_store_n(&pool_trap_held, 1, __ATOMIC_RELEASE);
    while (!__atomic_load_n(&pool_trap_go, __ATOMIC_ACQUIRE))
        sched_yield();
    long got = syscall(SYS_mmap, r[REG_RDI], r[REG_RSI], r[REG_RDX], r[REG_R10] | MAP_NONBLOCK, r[REG_R8], r[REG_R9]);
    r[REG_RAX] = got == -1 ? -errno : got;
}

/* The filter: an mmap of 1 GB or more without MAP_NONBLOCK (a pool's) traps; every other call passes. */
static int pool_trap_arm(void)
{
    struct sock_filter code[] = {
        FILTER_ONE_CALL(SYS_mmap),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[3])),
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, MAP_NONBLOCK, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1]) + 4),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0, 0, 2), /* 4 GB or more: not a pool */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[1])),
        BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 1u << 30, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = pool_trap;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSYS, &sa, NULL) != 0)
        return -1;
    return filter_install(code, sizeof code / sizeof code[0], 0);
}

#define TRAP_CLAIMS 512 /* 64 pools of 8 claims of 128 MB: enough to need a new pool */
static struct {
    void *claims[TRAP_CLAIMS];
    int child; /* the forked child's exit status */
} pool_trap_state;

static void *pool_trap_maker(void *arg)
{
    (void)arg;
    if (pool_trap_arm() != 0) {
        __atomic_store_n(&pool_trap_held, -1, __ATOMIC_RELEASE);
        return NULL;
    }
    for (unsigned i = 0; i < TRAP_CLAIMS && !__atomic_load_n(&pool_trap_go, __ATOMIC_ACQUIRE); i++)
        if ((pool_trap_state.claims[i] = port_caps.reserve_pooled((size_t)128 << 20, (size_t)2 << 20)) == NULL)
            break;
    int none = 0; /* no pool was made: the test must not wait for one */
    __atomic_compare_exchange_n(&pool_trap_held, &none, -2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
    return NULL;
}

static void *pool_trap_forker(void *arg)
{
    (void)arg;
    pid_t pid = fork();
    if (pid == 0)
        _exit(port_caps.reserve_pooled((size_t)128 << 20, (size_t)2 << 20) != NULL ? 0 : 3);
    int status = -1;
    if (pid > 0)
        waitpid(pid, &status, 0);
    pool_trap_state.child = status;
    return NULL;
}

static void hook_none(void) {}

TEST(a_fork_while_another_thread_makes_a_pool_leaves_the_child_pools_it_can_use)
{
    if (!pools_expected())
        SKIP_TEST();
    CHECK_EQ(port_caps.fork_hooks(hook_none, hook_none, hook_none), 0);
    thread_t maker, forker;
    CHECK_EQ(thread_start(&maker, pool_trap_maker, NULL), 0);
    while (__atomic_load_n(&pool_trap_held, __ATOMIC_ACQUIRE) == 0)
        sched_yield();
    int held = __atomic_load_n(&pool_trap_held, __ATOMIC_ACQUIRE);
    if (held > 0) {
        CHECK_EQ(thread_start(&forker, pool_trap_forker, NULL), 0);
        struct timespec pause = {0, 100 * 1000 * 1000}; /* the fork starts meanwhile */
        nanosleep(&pause, NULL);
        __atomic_store_n(&pool_trap_go, 1, __ATOMIC_RELEASE);
        thread_join(forker);
        CHECKF(WIFEXITED(pool_trap_state.child) && WEXITSTATUS(pool_trap_state.child) == 0,
               "the child of a fork during a pool's making took no pooled reservation (status %#x; 3: NULL)",
               pool_trap_state.child);
    }
    thread_join(maker);
    for (unsigned i = 0; i < TRAP_CLAIMS && pool_trap_state.claims[i] != NULL; i++)
        CHECK_EQ(port_release(pool_trap_state.claims[i], (size_t)128 << 20), 0);
    CHECKF(held != -2, "%u pooled reservations of 128 MB made no new pool", TRAP_CLAIMS);
    if (held == -1)
        SKIP_TEST(); /* no seccomp filter here (a container's own may forbid it) */
}
#endif

static void *slot_thread(void *arg)
{
    CHECK(slot_checked() == NULL);
    CHECK_EQ(slot_set(arg), 0);
    CHECK(slot_checked() == WIN_ONLY(arg));
    CHECK_EQ(slot_set((char *)arg + 16), 0); /* a second value replaces the first */
    CHECK(slot_checked() == WIN_ONLY((char *)arg + 16));
    return NULL;
}

static void *idle_thread(void *arg)
{
    (void)arg;
    CHECK(slot_checked() == NULL);
    return NULL;
}

/* The exit hook runs once for each thread that armed it (with its last value; on Windows with the slot
 * cleared) and for none that did not; Windows' slot is per thread. */
TEST(the_exit_hook_sees_every_thread_that_armed_it)
{
    static char values[HOOK_THREADS][64];
    thread_t t[HOOK_THREADS], idle[2];
#ifdef TEST_TLS_HIGH
    CHECKF(port_win64_tls_index >= 64, "TLS index %lu", (unsigned long)port_win64_tls_index);
#endif
    CHECK(slot_checked() == NULL);
    CHECK_EQ(slot_set(values), 0);
    CHECK(slot_checked() == WIN_ONLY(values));
    for (int i = 0; i < HOOK_THREADS; i++)
        CHECK_EQ(thread_start(&t[i], slot_thread, values[i]), 0);
    for (int i = 0; i < 2; i++)
        CHECK_EQ(thread_start(&idle[i], idle_thread, NULL), 0);
    for (int i = 0; i < HOOK_THREADS; i++)
        thread_join(t[i]);
    for (int i = 0; i < 2; i++)
        thread_join(idle[i]);
    CHECK(slot_checked() == WIN_ONLY(values)); /* the main thread's slot is its own */
    mutex_lock(&hook_lock);
    CHECK_EQ(hook_calls.calls, HOOK_THREADS);
    for (int i = 0; i < HOOK_THREADS; i++) {
        int seen = 0;
        for (int j = 0; j < hook_calls.calls && j < MAX_RECORDS; j++)
            if (hook_calls.values[j] == values[i] + 16) {
                seen++;
                CHECKF(hook_calls.slot_cleared[j], "thread %d: the slot was still set in the exit hook", i);
            }
        CHECKF(seen == 1, "thread %d: the exit hook saw its last value %d times", i, seen);
    }
    mutex_unlock(&hook_lock);
    CHECK_EQ(slot_set(NULL), 0);
    CHECK(slot_checked() == NULL);
}

/* The system's own monotonic milliseconds, through its C library or kernel32. */
static uint64_t reference_ms(void)
{
#ifdef _WIN32
    return GetTickCount64();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
#endif
}

TEST(the_clock_is_monotonic_in_ms_and_advances_across_a_second)
{
    uint64_t t0 = port_caps.clock_ms(), last = t0;
    for (int i = 0; i < 100000; i++) {
        uint64_t t = port_caps.clock_ms();
        CHECKF(t >= last, "the clock went back from %llu to %llu", (unsigned long long)last, (unsigned long long)t);
        last = t;
    }
    /* Each reading of the port's clock is bracketed by two of the system's, so that a thread descheduled
     * between two readings (a loaded machine) widens the bracket rather than failing the test. (Reading
     * t0 before the loop above, as this test once did, counted the loop's time on one side only.) */
    uint64_t r0a = reference_ms(), s0 = port_caps.clock_ms(), r0b = reference_ms();
    sleep_ms(1000);
    uint64_t r1a = reference_ms(), s1 = port_caps.clock_ms(), r1b = reference_ms();
    /* The port's clock and the system's own agree on the elapsed time to within their resolutions
     * (1-16 ms each): a wrong unit or another clock (wall time) would not. */
    long long d = (long long)(s1 - s0), least = (long long)(r1a - r0b), most = (long long)(r1b - r0a);
    CHECKF(d >= 960 && d >= least - 40 && d <= most + 40,
           "%lld ms measured across a 1000 ms sleep, %lld to %lld by the system", d, least, most);
}

/* fence_all_threads, by the store-buffer litmus test. Another thread stores x and then loads y, with
 * nothing but the compiler held back between them; this one stores y, fences every thread and loads x.
 * x86-64 lets a load pass its own thread's earlier store, so without the fence both loads may read 0
 * (a fence that does nothing gave it in 3,500-12,000 of the 20,000 rounds); with it, at least one of
 * them sees the other thread's store. */
enum { LITMUS_ROUNDS = 20000 };

struct litmus {
    int round, done; /* the round this thread started, the last round the other thread ended */
    int x, y, seen_y;
    unsigned delay;
};

static void litmus_spin(unsigned n)
{
    for (volatile unsigned i = 0; i < n; i++)
        ;
}

static void *litmus_thread(void *arg)
{
    struct litmus *l = arg;
    for (int round = 1; round <= LITMUS_ROUNDS; round++) {
        while (__atomic_load_n(&l->round, __ATOMIC_ACQUIRE) < round)
            ;
        litmus_spin(__atomic_load_n(&l->delay, __ATOMIC_RELAXED));
        __atomic_store_n(&l->x, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        __atomic_store_n(&l->seen_y, __atomic_load_n(&l->y, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
        __atomic_store_n(&l->done, round, __ATOMIC_RELEASE);
    }
    return NULL;
}

TEST(fence_all_threads_orders_another_threads_store_before_its_load)
{
    if (port_caps.fence_all_threads == NULL)
        SKIP_TEST(); /* Windows (win64.c says why) */
    if (port_caps.fence_all_threads() != 0) {
#ifdef _WIN32
        CHECK(!"the port offers a fence that fails");
#else
        /* Linux before 4.14, or a filter that refuses membarrier: the port says so, and nothing else. */
        long q = syscall(SYS_membarrier, 0 /* MEMBARRIER_CMD_QUERY */, 0, 0);
        CHECKF(q < 0 || (q & 8 /* PRIVATE_EXPEDITED */) == 0, "membarrier offers %lx, the port failed", q);
#endif
        return;
    }
    struct litmus l = { 0, 0, 0, 0, 0, 0 };
    thread_t t;
    int started = thread_start(&t, litmus_thread, &l) == 0;
    CHECK(started);
    if (!started)
        return;
    unsigned rng = 12345, both_zero = 0, fails = 0;
    for (int round = 1; round <= LITMUS_ROUNDS; round++) {
        __atomic_store_n(&l.x, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&l.y, 0, __ATOMIC_RELAXED);
        rng = rng * 1103515245u + 12345u;
        __atomic_store_n(&l.delay, (rng >> 16) % 64, __ATOMIC_RELAXED);
        __atomic_store_n(&l.round, round, __ATOMIC_RELEASE);
        litmus_spin((rng >> 8) % 64);
        __atomic_store_n(&l.y, 1, __ATOMIC_RELAXED);
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        fails += port_caps.fence_all_threads() != 0;
        int seen_x = __atomic_load_n(&l.x, __ATOMIC_RELAXED);
        while (__atomic_load_n(&l.done, __ATOMIC_ACQUIRE) < round)
            ;
        both_zero += seen_x == 0 && __atomic_load_n(&l.seen_y, __ATOMIC_RELAXED) == 0;
    }
    thread_join(t);
    CHECKF(fails == 0 && both_zero == 0, "%u of %d rounds saw neither store, %u fences failed", both_zero,
           LITMUS_ROUNDS, fails);
}

TEST(yield_returns)
{
    for (int i = 0; i < 100; i++)
        port_caps.yield();
}
