/*
 * Clock faults for a process the tests start (LD_PRELOAD). What the process reads as the time
 * of day (CLOCK_REALTIME and its variants, gettimeofday, time) is the real time plus a step
 * the test sets at any moment, plus an optional constant rate error; its monotonic clocks are
 * left alone, as an NTP step leaves them. Or, on its own, the monotonic clocks run at a wrong
 * rate (a client whose timers run slow), and the time of day is left alone.
 *
 * Written for this repository because libfaketime cannot start under jemalloc, which Debian's
 * redis-server uses (jemalloc reads the clock while libfaketime initialises). So it never
 * allocates, never calls dlsym, and reads the real clocks with the raw system call.
 *
 * DISTLOCK_CLOCK_FILE names a file of two little-endian int64s: the step in nanoseconds and its
 * bitwise complement (a read that sees a half-written pair is retried). DISTLOCK_CLOCK_PPM, if
 * set, makes the time of day run that many parts per million fast (negative: slow) from the
 * start; DISTLOCK_CLOCK_MONO_PPM does the same to the monotonic clocks.
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
static int64_t ppm, mono_ppm;
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
    const char *mono_rate = getenv("DISTLOCK_CLOCK_MONO_PPM");
    if (rate) ppm = strtoll(rate, NULL, 10);
    if (mono_rate) mono_ppm = strtoll(mono_rate, NULL, 10);
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

static int is_monotonic(clockid_t clk) {
    return clk == CLOCK_MONOTONIC || clk == CLOCK_MONOTONIC_COARSE || clk == CLOCK_MONOTONIC_RAW
        || clk == CLOCK_BOOTTIME;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, clk, ts);
    if (r != 0) return r;
    int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec;
    if (is_wall(clk)) {
        ns += offset_ns();
    } else if (mono_ppm && is_monotonic(clk)) {
        /* Every monotonic clock counts from its own zero; the rate error accrues from start. */
        ns += (mono_ns() - start_ns) / 1000000 * mono_ppm;
    } else {
        return 0;
    }
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
