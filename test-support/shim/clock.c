/*
 * A wall-clock fault for a server process the tests start (LD_PRELOAD): what the process reads
 * as the time of day (CLOCK_REALTIME and its variants, gettimeofday, time) is the real time
 * plus a step the test sets at any moment, plus an optional constant rate error. The
 * monotonic clocks are left alone, as an NTP step or a drifting oscillator leaves them.
 *
 * Written for this repository because libfaketime cannot start under jemalloc, which Debian's
 * redis-server uses (jemalloc reads the clock while libfaketime initialises). So it never
 * allocates, never calls dlsym, and reads the real clocks with the raw system call.
 *
 * DISTLOCK_CLOCK_FILE names a file of two little-endian int64s: the step in nanoseconds and its
 * bitwise complement (a read that sees a half-written pair is retried). DISTLOCK_CLOCK_PPM, if
 * set, makes the clock run that many parts per million fast (negative: slow) from the start.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile int64_t *step_pair; /* the mapped file, or NULL before the constructor ran */
static int64_t ppm;
static int64_t start_ns; /* CLOCK_MONOTONIC at start, for the rate */
static int64_t last_step;

static int64_t mono_ns(void) {
    struct timespec ts;
    syscall(SYS_clock_gettime, CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

__attribute__((constructor)) static void clock_shim_init(void) {
    const char *path = getenv("DISTLOCK_CLOCK_FILE");
    const char *rate = getenv("DISTLOCK_CLOCK_PPM");
    if (rate) ppm = strtoll(rate, NULL, 10);
    start_ns = mono_ns();
    if (!path) return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    void *m = mmap(NULL, 16, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (m != MAP_FAILED) step_pair = m;
}

static int64_t offset_ns(void) {
    int64_t off = 0;
    if (step_pair) {
        for (int i = 0; i < 100; i++) {
            int64_t v = step_pair[0], check = step_pair[1];
            if (v == ~check) { last_step = v; break; }
        }
        off = last_step;
    }
    if (ppm) off += (mono_ns() - start_ns) / 1000000 * ppm;
    return off;
}

static int is_wall(clockid_t clk) {
    return clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE || clk == CLOCK_TAI;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r != 0 || !is_wall(clk)) return r;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + offset_ns();
    ts->tv_sec = ns / 1000000000;
    ts->tv_nsec = ns % 1000000000;
    return 0;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
