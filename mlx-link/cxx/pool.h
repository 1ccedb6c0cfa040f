// The threads Grove's CPU primitives split their work over (pool.cpp): the
// caller plus GROVE_CPU_THREADS - 1 workers (default: the cores in this
// process's affinity mask), which spin briefly between jobs (a decode step
// runs hundreds back to back) and then sleep.
#pragma once

namespace grove_cpu {

// Threads a job may use, the caller included.
int pool_size();

// Runs fn(ctx, i) for i in [0, parts) (parts <= pool_size()) and returns when
// all ran; part 0 runs on the calling thread.
void parallel(int parts, void (*fn)(void*, int), void* ctx);

// The same over a callable, without allocating.
template <class F>
void parallel(int parts, F& part) {
  parallel(parts, [](void* ctx, int i) { (*static_cast<F*>(ctx))(i); }, &part);
}

}  // namespace grove_cpu
