// Runs a command as if the CPU had AVX2 and FMA but no AVX-512, AVX-VNNI or AMX: every
// process and thread of the command (children included) reads CPUID with those feature bits
// cleared, so each library's own run-time dispatch (glibc, ggml's variants, our kernel sets,
// PyTorch, oneDNN, MKL, ONNX Runtime's MLAS) picks its AVX2 code as on an AVX2 machine.
// A measuring aid for issue 12: an AVX2 box's figures on an AVX-512 CPU, taken with the
// engines' dispatch unchanged. Caches, clocks and memory stay those of the real CPU.
//
//   cc -O2 -o target/avx2-only tests/reference/avx2_only.c
//   target/avx2-only COMMAND [ARGS...]        (e.g. PIN=target/avx2-only compare_speed.sh)
//
// How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, x86-64 CPUs with the `cpuid_fault`
// flag) makes the CPUID instruction raise SIGSEGV in a thread that turned it off. This
// program traces the command with ptrace; at every exec it makes the new program call
// arch_prctl before its first instruction (the dynamic loader reads CPUID early, and the
// setting is reset by exec and inherited by fork and clone), and at every SIGSEGV on a CPUID
// instruction it executes CPUID itself, clears the bits and steps the thread past it. CPUID
// is read a few times per process, so the command's speed is not affected. XGETBV is not
// trapped: it still reports the AVX-512 register state enabled, which every library checks
// together with the CPUID bits.
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/syscall.h>
#include <sys/user.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef ARCH_SET_CPUID
#define ARCH_SET_CPUID 0x1012
#endif

#define BIT(n) (1u << (n))

// CPUID leaf 7 subleaf 0: EBX AVX512F, DQ, IFMA, PF, ER, CD, BW, VL; ECX VBMI, VBMI2, VNNI,
// BITALG, VPOPCNTDQ; EDX 4VNNIW, 4FMAPS, VP2INTERSECT, AMX-BF16, AVX512_FP16, AMX-TILE,
// AMX-INT8. Subleaf 1: EAX AVX-VNNI, AVX512_BF16.
static const uint32_t leaf7_ebx = BIT(16) | BIT(17) | BIT(21) | BIT(26) | BIT(27) | BIT(28) |
                                  BIT(30) | BIT(31);
static const uint32_t leaf7_ecx = BIT(1) | BIT(6) | BIT(11) | BIT(12) | BIT(14);
static const uint32_t leaf7_edx = BIT(2) | BIT(3) | BIT(8) | BIT(22) | BIT(23) | BIT(24) |
                                  BIT(25);
static const uint32_t leaf7_1_eax = BIT(4) | BIT(5);

static void die(const char *what) {
    fprintf(stderr, "avx2-only: %s: %s\n", what, strerror(errno));
    exit(125);
}

// Executes CPUID for the thread's EAX/ECX and writes the masked result into its registers.
static void emulate_cpuid(struct user_regs_struct *regs) {
    uint32_t leaf = (uint32_t)regs->rax, subleaf = (uint32_t)regs->rcx;
    uint32_t a, b, c, d;
    __cpuid_count(leaf, subleaf, a, b, c, d);
    if (leaf == 7 && subleaf == 0) {
        b &= ~leaf7_ebx;
        c &= ~leaf7_ecx;
        d &= ~leaf7_edx;
    } else if (leaf == 7 && subleaf == 1) {
        a &= ~leaf7_1_eax;
    }
    // CPUID writes 32-bit registers, which zeroes their upper halves.
    regs->rax = a;
    regs->rbx = b;
    regs->rcx = c;
    regs->rdx = d;
    regs->rip += 2;
}

// Runs one instruction (`what`) of the stopped thread `pid` and waits for it to stop again.
static void single_step(pid_t pid, const char *what) {
    int status;
    if (ptrace(PTRACE_SINGLESTEP, pid, 0, 0) == -1) die(what);
    if (waitpid(pid, &status, __WALL) == -1) die(what);
    if (!WIFSTOPPED(status) || WSTOPSIG(status) != SIGTRAP) {
        fprintf(stderr, "avx2-only: the thread did not stop after one step over %s\n", what);
        exit(125);
    }
}

// Makes the thread `pid`, stopped at an exec, run arch_prctl(ARCH_SET_CPUID, 0): a SYSCALL
// instruction written over its next two bytes, one single step, the bytes and registers put
// back.
static void disable_cpuid(pid_t pid) {
    struct user_regs_struct saved, regs;
    // The exec stop is still inside execve, whose return value would overwrite RAX: one step
    // first (the program's first instruction, never CPUID) stops the thread in user mode.
    single_step(pid, "the new program's first instruction");
    if (ptrace(PTRACE_GETREGS, pid, 0, &saved) == -1) die("read the registers after exec");
    errno = 0;
    long word = ptrace(PTRACE_PEEKTEXT, pid, (void *)saved.rip, 0);
    if (errno) die("read the code after exec");
    long patched = (word & ~0xffffL) | 0x050f; // 0f 05: SYSCALL
    if (ptrace(PTRACE_POKETEXT, pid, (void *)saved.rip, (void *)patched) == -1)
        die("write the code after exec");
    regs = saved;
    regs.rax = SYS_arch_prctl;
    regs.rdi = ARCH_SET_CPUID;
    regs.rsi = 0;
    if (ptrace(PTRACE_SETREGS, pid, 0, &regs) == -1) die("set the registers for arch_prctl");
    single_step(pid, "arch_prctl");
    if (ptrace(PTRACE_GETREGS, pid, 0, &regs) == -1) die("read arch_prctl's result");
    if ((long)regs.rax != 0) {
        fprintf(stderr,
                "avx2-only: arch_prctl(ARCH_SET_CPUID) failed (%ld): this CPU or kernel has "
                "no CPUID faulting (the `cpuid_fault` flag)\n",
                -(long)regs.rax);
        exit(125);
    }
    if (ptrace(PTRACE_POKETEXT, pid, (void *)saved.rip, (void *)word) == -1)
        die("restore the code after exec");
    if (ptrace(PTRACE_SETREGS, pid, 0, &saved) == -1) die("restore the registers after exec");
}

// Whether the thread stopped on a CPUID instruction (0f a2).
static int at_cpuid(pid_t pid, const struct user_regs_struct *regs) {
    errno = 0;
    long word = ptrace(PTRACE_PEEKTEXT, pid, (void *)regs->rip, 0);
    return errno == 0 && (word & 0xffff) == 0xa20f;
}

// Whether the thread's stop is a group stop (SIGTSTP and the like already delivered), which
// a tracer without PTRACE_SEIZE tells from a signal's delivery only by this call failing.
static int group_stop(pid_t pid) {
    siginfo_t info;
    return ptrace(PTRACE_GETSIGINFO, pid, 0, &info) == -1 && errno == EINVAL;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: avx2-only COMMAND [ARGS...]\n");
        return 125;
    }
    pid_t root = fork();
    if (root == -1) die("fork");
    if (root == 0) {
        if (ptrace(PTRACE_TRACEME, 0, 0, 0) == -1) die("trace the command");
        raise(SIGSTOP); // lets the tracer set its options before the exec
        execvp(argv[1], argv + 1);
        fprintf(stderr, "avx2-only: cannot run %s: %s\n", argv[1], strerror(errno));
        _exit(127);
    }
    int status;
    if (waitpid(root, &status, 0) == -1) die("wait for the command");
    long options = PTRACE_O_TRACEEXEC | PTRACE_O_TRACECLONE | PTRACE_O_TRACEFORK |
                   PTRACE_O_TRACEVFORK | PTRACE_O_EXITKILL;
    if (ptrace(PTRACE_SETOPTIONS, root, 0, (void *)options) == -1) die("set the trace options");
    if (ptrace(PTRACE_CONT, root, 0, 0) == -1) die("start the command");

    int exit_code = 125;
    for (;;) {
        pid_t pid = waitpid(-1, &status, __WALL);
        if (pid == -1) {
            if (errno == ECHILD) break; // every traced thread has ended
            if (errno == EINTR) continue;
            die("wait");
        }
        if (WIFEXITED(status) || WIFSIGNALED(status)) {
            if (pid == root)
                exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            continue;
        }
        if (!WIFSTOPPED(status)) continue;
        int signal = WSTOPSIG(status), event = status >> 16, deliver = 0;
        if (signal == SIGTRAP && event == PTRACE_EVENT_EXEC) {
            disable_cpuid(pid);
        } else if (signal == SIGTRAP && event != 0) {
            // clone, fork or vfork: the new thread or process is traced too and inherits the
            // CPUID setting; it reports an initial SIGSTOP of its own.
        } else if (signal == SIGSEGV) {
            struct user_regs_struct regs;
            if (ptrace(PTRACE_GETREGS, pid, 0, &regs) == 0 && at_cpuid(pid, &regs)) {
                emulate_cpuid(&regs);
                if (ptrace(PTRACE_SETREGS, pid, 0, &regs) == -1) die("write CPUID's result");
            } else {
                deliver = SIGSEGV; // a real fault of the command
            }
        } else if (signal != SIGSTOP && !group_stop(pid)) {
            // SIGSTOP is what a new thread or process reports first (a SIGSTOP sent to the
            // command is lost with it); a group stop resumes at once (job control is lost).
            deliver = signal;
        }
        // A thread that has just exited may be gone already (ESRCH): nothing to resume.
        if (ptrace(PTRACE_CONT, pid, 0, (void *)(long)deliver) == -1 && errno != ESRCH)
            die("resume a thread");
    }
    return exit_code;
}
