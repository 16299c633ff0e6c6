/* port.h - the platform contract, in allocator terms.
 *
 * Everything shardmm needs from an operating system (or from an embedder with no OS at all) is here.
 * A port is one file under port/ (linux.c, win64.c, region.c) that defines:
 * - the required functions below: address space (reserve, commit, decommit, release), and a way to
 *   report a fatal error;
 * - `port_caps`, a description of what else the platform offers: flags for its semantics and one
 *   pointer per optional function, NULL where it has none. The core reads it and does without what is
 *   missing (no clock: its delays count its own slow-path events; no thread-exit hook: threads call
 *   shard_thread_done; no fork hooks: no fork);
 * - the heap slot of the kind it chooses (SHARD_SLOT, below).
 * The functions hold no policy: no retries, no accounting, no messages; the callers in src/ decide.
 *
 * The model of memory is Windows': a reservation is address space only; commit makes a range readable
 * and writable and reading fresh memory gives zeros; decommit gives the memory back and keeps the
 * addresses; only whole reservations are released. Sizes and addresses are multiples of PORT_PAGE
 * (4 KB); reservations are aligned as the caller asks, at least to PORT_RESERVE_ALIGN (64 KB).
 */
#ifndef SHARD_PORT_H
#define SHARD_PORT_H

#include <stddef.h>
#include <stdint.h>

#define PORT_PAGE ((size_t)4096)
#define PORT_RESERVE_ALIGN ((size_t)65536)

/* ---- required --------------------------------------------------------------------------------------- */

/* Reserve size bytes of address space (size a multiple of PORT_RESERVE_ALIGN) at a multiple of align (a
 * power of two, PORT_RESERVE_ALIGN or more). The reservation is exactly [start, start+size): whatever the
 * port had to take beyond it to find an aligned start is given back before it returns, so the process's
 * address space (RLIMIT_AS counts it) holds no slack. Returns the start, or NULL when the platform
 * refuses. Nothing is readable yet. */
void *port_reserve(size_t size, size_t align);

/* Make [addr, addr+size) of a reservation readable and writable; fresh memory reads zero.
 * addr and size are multiples of PORT_PAGE. Returns 0, or -1 when the platform refuses (out of memory);
 * on -1 the range is left as it was. Committing a committed range is allowed and keeps its contents. */
int port_commit(void *addr, size_t size);

/* Give the memory of [addr, addr+size) back; the addresses stay reserved. The contents are lost and
 * the range must not be touched until it is committed again (what touching it does is in port_caps.flags).
 * addr and size are multiples of PORT_PAGE. Returns 0 or -1. */
int port_decommit(void *addr, size_t size);

/* Release a whole reservation: addr and size exactly as port_reserve gave and took them; or, where
 * port_caps.flags has PORT_RELEASE_PARTS, any part of one that starts and ends on a 4 MB boundary from
 * its start (or at its end), parts of one reservation released apart or, when they are next to each
 * other, as one. 0 or -1. */
int port_release(void *addr, size_t size);

/* Write a message to the platform's error channel (nothing is allocated), and end the process (or
 * whatever stands for it) abnormally: port_abort does not return. */
void port_write_error(const char *msg, size_t len);
_Noreturn void port_abort(void);

/* ---- capabilities ------------------------------------------------------------------------------------ */

/* What touching a decommitted range does (no core code touches one; the tests check the claim). */
#define PORT_DECOMMIT_FAULTS 1u       /* it faults (Windows) */
#define PORT_DECOMMIT_KEEPS_CHARGE 2u /* it reads zeros, and the range stays charged against the system's
                                       * commit limit until it is released (Linux, see linux.c) */
/* A reserve_large_pages reservation is committed whole when it is made (Linux, see linux.c): a commit
 * inside it would change nothing, and the core makes none (it counts the bytes all the same). */
#define PORT_LARGE_RESERVE_COMMITTED 4u
/* port_release takes parts of a reservation (Linux: munmap, and a pool's granules): the core's large
 * cache splits a block taken for much less and joins the parts again when they are free (large.c). */
#define PORT_RELEASE_PARTS 8u

/* Returned by thread_exit_arm in a thread whose exit hook has already run. */
#define PORT_SLOT_EXITED 1
/* A thread number that port_caps.thread_id never returns (the core's mark for "no live thread"). */
#define PORT_THREAD_NONE 0xffffffffu

typedef struct port_capabilities {
    unsigned flags; /* PORT_DECOMMIT_*, PORT_LARGE_RESERVE_COMMITTED, PORT_RELEASE_PARTS */

    /* Move the pages of [from, from+size), committed and inside the reservation [reservation,
     * +reservation_size), to [to, to+size) inside another reservation, without copying (their contents
     * and commitment go with them; what was at `to` is replaced), and release the rest of the source
     * reservation. 0; or -1 with nothing changed. One call, because after the move the source addresses
     * are free for anyone's mapping. Without it a large block that must move is copied. */
    int (*move_release)(void *reservation, size_t reservation_size, void *from, size_t size, void *to);

    /* A hint that [addr, addr+size) of a reservation is used in large contiguous pieces, so that the
     * platform may back its committed parts with large pages (only a range committed as a whole gets
     * them, so nothing outside what was committed becomes resident). */
    void (*hint_large_pages)(void *addr, size_t size);

    /* port_reserve for a reservation that is committed in small pieces and wants large pages under them
     * from offset `from` on (the core's segments and medium arenas, SHARDMM_HUGE_PAGES: from 0 or 2 MB):
     * the same result, and commit, decommit and release work on it as on any reservation, with every
     * guarantee of the contract (a commit that returns 0 is backed). What differs: the platform may back
     * a whole large page from `from` on at the first touch of a committed byte in it, uncommitted
     * neighbours included, so resident memory may exceed what the core committed by up to a large page
     * less a piece for each large page touched; and the uncommitted parts may read zeros rather than
     * fault (the core touches none). With PORT_LARGE_RESERVE_COMMITTED it comes committed whole, and the
     * core commits nothing inside it. Like reserve_pooled's, it may be carved from a bigger reservation
     * the platform keeps (Linux), so that making it takes no system call that waits for the process's
     * mapping lock; it is then not checked against the system's commit charge, where that check could
     * refuse none. Without it the core takes port_reserve, and no large pages. NULL:
     * none now (out of memory, or large pages are not to be had: Linux under mlockall), and the core
     * takes port_reserve for that reservation. */
    void *(*reserve_large_pages)(size_t size, size_t align, size_t from);

    /* port_reserve for a large block (size and align multiples of PORT_RESERVE_ALIGN): the same result,
     * and commit, decommit, release (of the whole reservation, or of parts under PORT_RELEASE_PARTS)
     * and move_release work on it as on any reservation, but it may be carved from a bigger
     * reservation the platform keeps, so that making it takes no system call. What may differ: it may
     * come committed and hinted for large pages already (the core's commits and hints there then cost
     * little, and are not checked against the system's commit charge: a platform offers pools only
     * where that check could refuse no such reservation), and its uncommitted parts may read zeros
     * rather than fault (the core touches none). A large page that a commit covers only in part stays
     * on small pages there too, as outside a pool (Linux: a commit's mprotect splits the mapping, and a
     * huge page needs a whole 2 MB of one), until the reservation's release. NULL: the core takes
     * port_reserve. */
    void *(*reserve_pooled)(size_t size, size_t align);

    /* Back [addr, addr+size) of a reserve_large_pages reservation below its `from` (large-page
     * aligned, committed) with large pages now: what is resident there is copied into them, and all of
     * the range becomes resident. The core's way to give a heap that has grown the large pages it was
     * first denied (segment.h: segment_spared_commit). Nothing visible changes but resident memory; it
     * may do nothing, or less than asked where it judges the copy dearer than what it saves (Linux:
     * linux.c). 1: all of the range is on large pages now; 0: not. Without it: small pages stay. */
    int (*collapse_large_pages)(void *addr, size_t size);

    /* Make the committed [addr, addr+size) resident now, as the writes about to come would page by page
     * (Linux: MADV_POPULATE_WRITE, one system call instead of a fault a page). A hint: it may do nothing,
     * and the contents stay what they were. The core's carving asks it for pages on small pages
     * (src/small.c: carve_reach). Without it: the writes fault the pages in. */
    void (*populate)(void *addr, size_t size);

    /* How many of the pages of [addr, addr+size) (page-aligned, committed) are resident now (Linux:
     * mincore): SIZE_MAX when it cannot tell. The core asks it of the last 2 MB of a large block left
     * on small pages, at the block's free, to learn whether the program uses its large blocks to their
     * ends (src/large.c: earned tails). Without it: every block's last 2 MB may be a large page. */
    size_t (*resident_pages)(void *addr, size_t size);

    /* The most address space the process may hold, bytes; SIZE_MAX when unlimited (Linux: RLIMIT_AS or
     * RLIMIT_DATA, the lower). Read for the rare decisions that depend on it (large blocks' address
     * headroom). Without it: unlimited. */
    size_t (*address_space_limit)(void);

    /* Milliseconds from an arbitrary start, monotonic, with a resolution of some 1-16 ms. Without it the
     * core's delays count its own clock reads instead (each one a slow-path event: a page freed past
     * the kept ones, a heap retired, a large block cached). */
    uint64_t (*clock_ms)(void);

    /* Give the processor to another thread after spinning has not helped. Without it: spin on. */
    void (*yield)(void);
    /* A full memory fence in every running thread of the process, as if each had run one at some point
     * during the call (Linux: membarrier's private expedited command; Windows has none, see win64.c):
     * with it, one side of a handshake that is used rarely pays for both, and the side used often
     * stores and loads without a fence (src/large.c: the threads' spares). 0 when done; -1 when it
     * could not be (then nothing is guaranteed). The core calls it once at start-up, and uses it only
     * if that call returned 0. Without it: both sides use locked instructions. */
    int (*fence_all_threads)(void);

    /* The thread-exit hook. thread_exit_hook registers fn, once per process, before the first heap is
     * armed: 0; -1 when there is no hook to give (every pthread key of the process taken), and then no
     * thread's exit is reported. thread_exit_arm(heap), called by a thread after it stored heap in its
     * slot (or NULL after clearing it), asks for fn(heap) at that thread's exit: 0; -1 when refused;
     * PORT_SLOT_EXITED when the thread's exit hook has already run (code that runs later in its exit: a
     * destructor of thread-local data that allocates), so that no hook would ever give the heap back.
     * Arming may allocate (glibc's pthread_setspecific callocs a key array); it comes after the store so
     * that such an allocation finds the heap in the slot. fn runs once per armed thread; it clears the
     * slot itself. Without these, threads end their use of a heap with shard_thread_done. */
    int (*thread_exit_hook)(void (*fn)(void *heap));
    int (*thread_exit_arm)(void *heap);

    /* Threads by number, for the heaps whose threads exited without the exit hook: thread_id() is the
     * calling thread's number, unique among the process's live threads, never 0 or PORT_THREAD_NONE (a
     * system call: called when a thread takes a heap); thread_alive(id) is 0 when no live thread has
     * that number any more, 1 when one has or the port cannot tell. Without them such heaps stay with
     * their blocks. */
    uint32_t (*thread_id)(void);
    int (*thread_alive)(uint32_t id);

    /* Functions the platform calls around fork(): prepare in the parent before it, parent in the parent
     * after it, child in the child. Registered once per process; 0 or -1. With them, thread_tag, which
     * is then the same for a thread and, after fork, for the child's one thread (who runs the fork
     * handlers, for the locks they hold). thread_tag: a value, read without a call to the OS, that
     * differs between live threads (also the start-up's thread and a cached large block's freer: heap.c,
     * large.c). Without it every thread has the same tag (1), and nothing is told apart by it. */
    int (*fork_hooks)(void (*prepare)(void), void (*parent)(void), void (*child)(void));
    uintptr_t (*thread_tag)(void);

    /* An allocation returns NULL for want of memory (or an impossible size), or a function was given an
     * invalid argument: tell the caller the C library's way (errno = ENOMEM / EINVAL; on Windows the
     * thread's last error). Without them the NULL (or error code) is all the caller learns. */
    void (*out_of_memory)(void);
    void (*invalid_argument)(void);

    /* The process's options: the variables of the environment it started with whose names begin with
     * "SHARDMM_" (PORT_OPTION_PREFIX). options(fn, arg) calls fn(arg, entry, len) once for each, entry
     * being "SHARDMM_NAME=value" as bytes (len of them, not NUL-terminated): what src/options.c parses.
     * A platform whose environment is not bytes gives each character below 128 as itself and any other
     * as '?', and may cut an entry longer than PORT_OPTION_MAX bytes there, its last byte then '?' (no
     * valid option is that long). Called once, at start-up (heap_start): it must not allocate through
     * shardmm. Without it every option keeps its default. */
    void (*options)(void (*fn)(void *arg, const char *entry, size_t len), void *arg);

    /* Ask for fn() once at the process's normal end (exit, a return from main; not _exit, abort or a
     * kill), after the program's own exit-time code where the platform can order it so: the allocator's
     * last words (SHARDMM_SHOW_STATS, SHARDMM_REPORT_LEAKS). Called at most once, at start-up; it must
     * not allocate through shardmm. 0, or -1 when refused. fn allocates nothing. Without it nothing
     * runs at exit. */
    int (*process_exit_hook)(void (*fn)(void));

    /* Where the code at addr comes from, as text for a report: the path of the module that holds it and
     * addr's offset in it, with the function's name where the platform knows it, written into buf
     * (at most size - 1 bytes and a NUL). Returns the bytes written; 0 when it cannot tell. Called by the
     * full-debug build's reports (a program's bug being reported): it must not allocate through shardmm.
     * Without it the reports give the bare address. */
    size_t (*symbolize)(const void *addr, char *buf, size_t size);
} port_capabilities;

#define PORT_OPTION_PREFIX "SHARDMM_"
#define PORT_OPTION_MAX 255

/* Defined by the port; read by the core only (a port with no OS fills parts of it at its own start-up). */
extern port_capabilities port_caps;

/* ---- the heap slot ------------------------------------------------------------------------------------ */

/* Every allocation reads the calling thread's heap from its slot, so where the slot lives is the port's
 * choice, made at build time with SHARD_SLOT; the core (src/heap.h) and the NASM fast paths
 * (asm/abi.inc) follow it. What the slot holds while a thread has no heap is the core's business.
 *   PORT_SLOT_TLS       a thread-local word of the core's, initial-exec TLS (one fs-relative load): Linux
 *   PORT_SLOT_TEB       the port's TLS index, read from the TEB (gs); the port stores it: Windows
 *   PORT_SLOT_GLOBAL    one word of the core's for the whole process: a platform with one thread (or
 *                       whose threads never call the allocator at the same time)
 *   PORT_SLOT_FUNCTION  a word of the platform's own per-thread data, whose address the port's
 *                       port_heap_slot_address() returns (it reads zero in a new thread): an embedder's
 *                       threads
 * The numbers are spelled out again in asm/abi.inc. */
#define PORT_SLOT_TLS 1
#define PORT_SLOT_TEB 2
#define PORT_SLOT_GLOBAL 3
#define PORT_SLOT_FUNCTION 4

#ifndef SHARD_SLOT /* the built-in ports' choices, for a build that does not name one */
#if defined(SHARD_PORT_REGION)
#define SHARD_SLOT PORT_SLOT_FUNCTION
#elif defined(_WIN64)
#define SHARD_SLOT PORT_SLOT_TEB
#else
#define SHARD_SLOT PORT_SLOT_TLS
#endif
#endif

#if SHARD_SLOT == PORT_SLOT_FUNCTION
/* The address of the calling thread's slot word; called on every allocation and free that needs the
 * heap, from the NASM fast paths too (through a helper that keeps every register): no allocation, no
 * locks. */
void **port_heap_slot_address(void);
#elif SHARD_SLOT == PORT_SLOT_TEB
/* Store heap (NULL: none) in the calling thread's slot: 0, or -1 when the port has no slot (no TLS
 * index could be had). */
int port_heap_slot_store(void *heap);
/* The slot, NULL until port_heap_slot_store stored a heap. The TEB's TLS slots: gs:[0x1480 + 8*i] for
 * an index below 64. port_win64_slot_offset is that offset once port_caps.thread_exit_hook has taken
 * the index, 0 before it and for an index of 64 or above, whose slot lives behind the TEB's expansion
 * pointer. Then the read calls port_win64_heap_slot_far, an assembly leaf in win64.c that changes no
 * register but rax and the flags, so that the fast paths around this read need no stack frame for a
 * call they almost never make. The asm is volatile: the slot changes under the compiler's feet when
 * port_heap_slot_store runs. */
static inline void *port_heap_slot(void)
{
    void *heap;
    __asm__ volatile("movq port_win64_slot_offset(%%rip), %0\n\t"
                     "testq %0, %0\n\t"
                     "jz 1f\n\t"
                     "movq %%gs:(%0), %0\n\t"
                     "jmp 2f\n"
                     "1:\n\t"
                     "call port_win64_heap_slot_far\n"
                     "2:"
                     : "=a"(heap)
                     :
                     : "cc");
    return heap;
}
#elif SHARD_SLOT != PORT_SLOT_TLS && SHARD_SLOT != PORT_SLOT_GLOBAL
#error "shardmm: SHARD_SLOT must be PORT_SLOT_TLS, PORT_SLOT_TEB, PORT_SLOT_GLOBAL or PORT_SLOT_FUNCTION"
#endif

#endif
