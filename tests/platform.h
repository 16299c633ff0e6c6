/* platform.h - what the test programs need from the OS beyond the C library, on Linux and Windows.
 *
 *   sleep_ms(ms)                       sleep
 *   thread_start(&t, fn, arg)          a thread of the OS's own kind (pthread_create on Linux,
 *   thread_join(t)                     CreateThread on Windows); 0 on success
 *   mutex_t m = MUTEX_INIT;            a lock: mutex_lock(&m), mutex_unlock(&m)
 *   child_run(action, &result)         run child_action(action) - which the including file defines -
 *                                      in a child process, and report how it ended and what it wrote
 *                                      to stderr (Linux: fork; Windows: the program starts itself again
 *                                      with SHARD_TEST_CHILD=action in its environment)
 *
 *   after_exit_setup(rounds)           once, 0 on success; then after_exit_arm(thread) in a thread: when
 *   after_exit_arm(thread)             it ends, after shardmm's own exit hook, after_exit_action(thread)
 *                                      - which the including file defines - runs `rounds` times in it
 *                                      (at most 4, glibc's rounds of key destructors)
 *
 * A program that uses child_run defines PLATFORM_CHILD before including this file, and
 * `static void child_action(const char *action)`; one that uses after_exit_setup defines
 * PLATFORM_AFTER_EXIT and `static void after_exit_action(int thread)`.
 */
#ifndef PLATFORM_H
#define PLATFORM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _WIN32
#define WIN32_LEAN_AND_MEAN
#include <windows.h>
#else
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#endif

typedef void *(*thread_fn)(void *);

#ifdef _WIN32

typedef struct { HANDLE handle; thread_fn fn; void *arg; } *thread_t;
typedef SRWLOCK mutex_t;
#define MUTEX_INIT SRWLOCK_INIT
#define mutex_lock(m) AcquireSRWLockExclusive(m)
#define mutex_unlock(m) ReleaseSRWLockExclusive(m)

__attribute__((unused)) static void sleep_ms(long ms) { Sleep((DWORD)ms); }

static DWORD WINAPI platform_thread_entry(LPVOID p)
{
    thread_t t = (thread_t)p;
    t->fn(t->arg);
    return 0;
}

__attribute__((unused)) static int thread_start(thread_t *out, thread_fn fn, void *arg)
{
    thread_t t = (thread_t)calloc(1, sizeof *t);
    if (t == NULL)
        return -1;
    t->fn = fn;
    t->arg = arg;
    t->handle = CreateThread(NULL, 0, platform_thread_entry, t, 0, NULL);
    if (t->handle == NULL) {
        free(t);
        return -1;
    }
    *out = t;
    return 0;
}

__attribute__((unused)) static void thread_join(thread_t t)
{
    WaitForSingleObject(t->handle, INFINITE);
    CloseHandle(t->handle);
    free(t);
}

#else

typedef pthread_t thread_t;
typedef pthread_mutex_t mutex_t;
#define MUTEX_INIT PTHREAD_MUTEX_INITIALIZER
#define mutex_lock(m) pthread_mutex_lock(m)
#define mutex_unlock(m) pthread_mutex_unlock(m)

__attribute__((unused)) static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) != 0)
        ;
}

__attribute__((unused)) static int thread_start(thread_t *out, thread_fn fn, void *arg)
{
    return pthread_create(out, NULL, fn, arg) == 0 ? 0 : -1;
}

__attribute__((unused)) static void thread_join(thread_t t) { pthread_join(t, NULL); }

#endif

#ifdef PLATFORM_CHILD

typedef struct {
    int started;      /* the child ran */
    int aborted;      /* it ended as abort() ends a process: SIGABRT on Linux, exit code 3 on Windows */
    int exit_code;    /* its exit code when it exited normally (Linux) or at all (Windows) */
    char err[1024];   /* the start of what it wrote to stderr, NUL-terminated */
} child_result;

static void child_action(const char *action);

#ifdef _WIN32

/* The child: the environment names the action; run it before main and exit 0 if it returns. */
__attribute__((constructor)) static void platform_child_entry(void)
{
    const char *action = getenv("SHARD_TEST_CHILD");
    if (action != NULL && *action != 0) {
        child_action(action);
        fflush(stdout);
        fflush(stderr);
        ExitProcess(0);
    }
}

__attribute__((unused)) static void child_run(const char *action, child_result *r)
{
    char exe[MAX_PATH];
    SECURITY_ATTRIBUTES sa = { sizeof sa, NULL, TRUE };
    HANDLE rd = NULL, wr = NULL;
    STARTUPINFOA si;
    PROCESS_INFORMATION pi;
    DWORD n, code = 0;
    size_t got = 0;
    memset(r, 0, sizeof *r);
    if (GetModuleFileNameA(NULL, exe, sizeof exe) == 0 || !CreatePipe(&rd, &wr, &sa, 0))
        return;
    SetHandleInformation(rd, HANDLE_FLAG_INHERIT, 0);
    memset(&si, 0, sizeof si);
    si.cb = sizeof si;
    si.dwFlags = STARTF_USESTDHANDLES;
    si.hStdInput = GetStdHandle(STD_INPUT_HANDLE);
    si.hStdOutput = GetStdHandle(STD_OUTPUT_HANDLE);
    si.hStdError = wr;
    SetEnvironmentVariableA("SHARD_TEST_CHILD", action);
    BOOL ok = CreateProcessA(exe, NULL, NULL, NULL, TRUE, 0, NULL, NULL, &si, &pi);
    SetEnvironmentVariableA("SHARD_TEST_CHILD", NULL);
    CloseHandle(wr);
    if (!ok) {
        CloseHandle(rd);
        return;
    }
    while (got + 1 < sizeof r->err && ReadFile(rd, r->err + got, (DWORD)(sizeof r->err - 1 - got), &n, NULL) && n > 0)
        got += n;
    r->err[got] = 0;
    CloseHandle(rd);
    WaitForSingleObject(pi.hProcess, INFINITE);
    GetExitCodeProcess(pi.hProcess, &code);
    CloseHandle(pi.hProcess);
    CloseHandle(pi.hThread);
    r->started = 1;
    r->exit_code = (int)code;
    r->aborted = code == 3;
}

#else

__attribute__((unused)) static void child_run(const char *action, child_result *r)
{
    int fds[2], status = 0;
    size_t got = 0;
    ssize_t n;
    memset(r, 0, sizeof *r);
    fflush(stdout);
    fflush(stderr);
    if (pipe(fds) != 0)
        return;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        child_action(action);
        _exit(0);
    }
    close(fds[1]);
    while (got + 1 < sizeof r->err && (n = read(fds[0], r->err + got, sizeof r->err - 1 - got)) > 0)
        got += (size_t)n;
    r->err[got] = 0;
    close(fds[0]);
    if (waitpid(pid, &status, 0) != pid)
        return;
    r->started = 1;
    r->aborted = WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT;
    r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
#endif /* PLATFORM_CHILD */

/* With the harness (included first): run fn(arg) on a thread of its own and wait for it; a thread that
 * cannot start is a test failure. */
#ifdef HARNESS_H
__attribute__((unused)) static void run_thread(thread_fn fn, void *arg)
{
    thread_t t;
    int rc = thread_start(&t, fn, arg);
    CHECKF(rc == 0, "thread_start: %d", rc);
    if (rc == 0)
        thread_join(t);
}
#endif

#ifdef PLATFORM_AFTER_EXIT
/* Thread-local destructors run at thread exit, some after the allocator's own exit hook, and may
 * allocate (a C++ thread_local object that logs, a runtime's per-thread cleanup). On Linux: a pthread
 * key made after the allocator's (so its destructor runs after ours) that sets itself again for each
 * further round; on Windows: a TLS callback of the program, which Windows runs after the FLS callbacks. */
static void after_exit_action(int thread);
static int after_exit_rounds;

#ifdef _WIN32
static DWORD after_exit_index = TLS_OUT_OF_INDEXES; /* holds thread + 1 in an armed thread */

static void NTAPI after_exit_callback(PVOID module, DWORD reason, PVOID reserved)
{
    (void)module;
    (void)reserved;
    if (reason != DLL_THREAD_DETACH || after_exit_index == TLS_OUT_OF_INDEXES)
        return;
    intptr_t thread = (intptr_t)TlsGetValue(after_exit_index) - 1;
    for (int round = 0; thread >= 0 && round < after_exit_rounds; round++)
        after_exit_action((int)thread);
}
__attribute__((section(".CRT$XLF"), used)) static const PIMAGE_TLS_CALLBACK after_exit_tls = after_exit_callback;

static int after_exit_setup(int rounds)
{
    after_exit_rounds = rounds;
    after_exit_index = TlsAlloc();
    return after_exit_index != TLS_OUT_OF_INDEXES ? 0 : -1;
}

static void after_exit_arm(int thread) { TlsSetValue(after_exit_index, (void *)(intptr_t)(thread + 1)); }
#else
static pthread_key_t after_exit_key;
static __thread int after_exit_done; /* rounds run in this thread */

static void after_exit_destructor(void *value)
{
    after_exit_action((int)(intptr_t)value - 1);
    if (++after_exit_done < after_exit_rounds) /* glibc calls again while a value is set */
        pthread_setspecific(after_exit_key, value);
}

static int after_exit_setup(int rounds)
{
    after_exit_rounds = rounds;
    return pthread_key_create(&after_exit_key, after_exit_destructor); /* after the allocator's key */
}

static void after_exit_arm(int thread) { pthread_setspecific(after_exit_key, (void *)(intptr_t)(thread + 1)); }
#endif
#endif /* PLATFORM_AFTER_EXIT */

#endif
