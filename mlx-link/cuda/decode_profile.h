// GROVE_FD_PROFILE=1, a diagnostic of Grove's CUDA decode step (decode.cu):
// the GPU time of each kind of kernel, from events recorded around every
// launch (the step then waits for the device), and the host time of a
// step's launches, printed every 256 steps.
#pragma once
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <vector>

namespace grove_fd {

struct Profile {
  enum Kind { kEmbed, kQkv, kAttend, kO, kRoute, kGlu, kDown, kHead, kCopy, kKinds };
  bool on = false;
  bool counts = false;  // GROVE_FD_PROFILE=2: steps, copies and host time only (graphs kept)
  bool sync = false;    // GROVE_FD_PROFILE=3: the same, each step waited for
  std::vector<cudaEvent_t> ev;
  std::vector<int> kind;
  size_t n = 0;
  double us[kKinds] = {}, host_us = 0;
  long steps = 0, copies = 0;
  std::chrono::steady_clock::time_point t0;

  void mark(cudaStream_t s, int k) {
    if (!on) return;
    if (n == ev.size()) {
      ev.emplace_back();
      cudaEventCreate(&ev.back());
      kind.push_back(0);
    }
    kind[n] = k;
    cudaEventRecord(ev[n++], s);
  }
  void begin(cudaStream_t s) {
    if (counts) t0 = std::chrono::steady_clock::now();
    if (!on) return;
    n = 0;
    t0 = std::chrono::steady_clock::now();
    mark(s, -1);
  }
  void end() {
    if (counts) {
      host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      if (++steps % 256 == 0)
        fprintf(stderr, "grove decode counts: %ld steps; cache copies %ld; host per step %.1f us\n", steps, copies,
                host_us / steps);
    }
    if (!on) return;
    host_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    cudaEventSynchronize(ev[n - 1]);
    for (size_t i = 1; i < n; i++) {
      float ms = 0.f;
      cudaEventElapsedTime(&ms, ev[i - 1], ev[i]);
      us[kind[i]] += 1000.0 * ms;
    }
    if (++steps % 256 == 0) {
      const double k = 1.0 / steps;
      fprintf(stderr,
              "grove decode profile: %ld steps; per step (us): embed %.1f, qkv %.1f, attend %.1f, "
              "o %.1f, route %.1f, glu %.1f, down %.1f, head %.1f, cache copies %.1f (%ld); host launches %.1f\n",
              steps, us[kEmbed] * k, us[kQkv] * k, us[kAttend] * k, us[kO] * k, us[kRoute] * k, us[kGlu] * k,
              us[kDown] * k, us[kHead] * k, us[kCopy] * k, copies, host_us * k);
    }
  }
};

}  // namespace grove_fd
