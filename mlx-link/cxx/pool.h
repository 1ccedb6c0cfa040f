// The threads Grove's CPU primitives split their work over (pool.cpp): the
// caller plus GROVE_CPU_THREADS - 1 workers (default: the cores in this
// process's affinity mask), which spin briefly between jobs (a decode step
// runs hundreds back to back) and then sleep.
#pragma once

namespace grove_cpu {

// Threads a job may use, the caller included.
int pool_size();

// One chunk of a job: fn(ctx, chunk, thread), thread in [0, pool_size()).
typedef void (*ChunkFn)(void* ctx, int chunk, int thread);

// Runs fn for every chunk in [0, n) (n < 65536) on whichever threads are
// free, the caller's included, and returns when all ran. No chunk waits for
// a thread that has not started: the threads running take the rest.
void chunks(int n, ChunkFn fn, void* ctx);

// The same over a callable `part(chunk, thread)`, without allocating.
template <class F>
void chunks(int n, F& part) {
  chunks(n, [](void* ctx, int c, int t) { (*static_cast<F*>(ctx))(c, t); }, &part);
}

}  // namespace grove_cpu
