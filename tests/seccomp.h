/* seccomp.h - the tests' seccomp filters (Linux x86-64): the start every filter shares, and their
 * installation. A filter lists FILTER_ONE_CALL(call) first, so that calls of other architectures and
 * other system calls pass; its own instructions, which look at the call's arguments, follow. */
#ifndef TEST_SECCOMP_H
#define TEST_SECCOMP_H

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#define FILTER_ONE_CALL(call)                                                   \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),   \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),              \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),                               \
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),     \
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (call), 1, 0),                          \
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

/* The process's threads made from now on, and this one, run under the n instructions of code (with
 * `flags` SECCOMP_FILTER_FLAG_TSYNC, every thread it has already too): 0, or -1 where the process may not
 * (a container's own filter may forbid it). */
static int filter_install(struct sock_filter *code, size_t n, unsigned flags)
{
    struct sock_fprog prog = {(unsigned short)n, code};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog) == 0 ? 0 : -1;
}

#endif
