// Pins each thread of the OpenMP team (torch's intra-op threads: torch ships the libgomp this
// library links) to one CPU: thread i to cpus[i]. A team of the same size reuses the same
// threads, so the placement holds for every later parallel region of the calling thread.
// Returns how many threads could not be pinned (0: all of them).

#include <omp.h>
#include <sched.h>

extern "C" int radixserve_bind_threads(const int* cpus, int n) {
  int failed = 0;
#pragma omp parallel num_threads(n) reduction(+ : failed)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[omp_get_thread_num()], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) failed += 1;  // 0: the calling thread
  }
  return failed;
}
