/* sprof.c - a sampling profiler for machines without perf, gdb or nsys (the GPU machine): LD_PRELOAD it, and every
 * millisecond of process CPU time (SIGPROF) the interrupted thread's backtrace() is kept; at exit the samples and
 * /proc/self/maps go to $SPROF_OUT/sprof.PID.txt, which tools/sprof_sym.py symbolises with the very binary that ran
 * (a rebuilt one has other addresses).
 *   gcc -O2 -shared -fPIC -o .carry/libsprof.so tools/sprof.c
 *   SPROF_OUT=$OUT LD_PRELOAD=$PWD/.carry/libsprof.so .carry/bin/bench_gpu_layers ...        (on the GPU machine)
 *   python3 tools/sprof_sym.py sprof.PID.txt /tmp/cub/bench_gpu_layers bench_gpu_layers forward_dev   (here)
 * Samples are CPU time: a thread blocked in the kernel is not sampled, one spinning in cudaStreamSynchronize is.
 * It found the tenth session's arena merge (docs/CUDA.md, "The bf16 maths on tensor cores"). */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

#define MAXS 100000
#define DEPTH 64

static void *buf[MAXS][DEPTH];
static int depth[MAXS];
static int tid[MAXS];
static volatile int n;

static void on_prof(int sig)
{
    (void)sig;
    const int i = __atomic_fetch_add(&n, 1, __ATOMIC_RELAXED);
    if (i >= MAXS) return;
    depth[i] = backtrace(buf[i], DEPTH);
    tid[i] = (int)gettid();
}

__attribute__((constructor)) static void start(void)
{
    void *t[4];
    backtrace(t, 4); /* loads the unwinder now, not in the signal handler */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prof;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    const struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &it, NULL);
}

__attribute__((destructor)) static void stop(void)
{
    const struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    const char *o = getenv("SPROF_OUT");
    char path[512];
    snprintf(path, sizeof path, "%s/sprof.%d.txt", o ? o : "/tmp", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return;
    const int m = n < MAXS ? n : MAXS;
    for (int i = 0; i < m; i++) {
        fprintf(f, "%d", tid[i]);
        for (int k = 0; k < depth[i]; k++) fprintf(f, " %p", buf[i][k]);
        fputc('\n', f);
    }
    fprintf(f, "MAPS\n");
    FILE *mp = fopen("/proc/self/maps", "r");
    char line[1024];
    while (mp && fgets(line, sizeof line, mp)) fputs(line, f);
    if (mp) fclose(mp);
    fclose(f);
}
