// The moment a test program injects its fault, for the harness's time limit
// (tests/run_fault_case.sh): with MPIML_FAULT_MARK set, the wall-clock time
// is appended to that file as "<seconds>.<nanoseconds>". The limit then counts
// from the fault, not from a start-up that a loaded machine may slow down.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>

inline void fault_mark() {
    const char* path = std::getenv("MPIML_FAULT_MARK");
    if (!path || !*path) return;
    timespec t{};
    ::clock_gettime(CLOCK_REALTIME, &t);
    char line[64];
    const int n = std::snprintf(line, sizeof line, "%lld.%09ld\n", static_cast<long long>(t.tv_sec), t.tv_nsec);
    const int fd = ::open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    if (::write(fd, line, static_cast<size_t>(n)) != n) std::perror("fault_mark: write");
    ::close(fd);
}
