/* sim_child.h: the simulator tests' way to run a case that should fault:
 * in a child process, its stderr (where the simulator names a fault)
 * captured. Included by tests/sim/test_cusim_faults.cu and
 * test_cusim_mma.cu (C++). */
#ifndef SKV_SIM_CHILD_H
#define SKV_SIM_CHILD_H

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

/* Runs fn in a child process (killed by SIGALRM after 60 s); returns what
 * it wrote on stderr, and its status in *st (the exit code, or 128 + the
 * signal). */
static inline std::string in_child(int (*fn)(void), int *st) {
    int p[2];
    if (pipe(p)) return "pipe failed";
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 2);
        alarm(60);
        _exit(fn());
    }
    close(p[1]);
    std::string out;
    char buf[512];
    ssize_t k;
    while ((k = read(p[0], buf, sizeof buf)) > 0) out.append(buf, (size_t)k);
    close(p[0]);
    int ws = 0;
    waitpid(pid, &ws, 0);
    *st = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
    return out;
}

#endif
