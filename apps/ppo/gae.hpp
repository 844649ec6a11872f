// GAE-lambda advantages and rewards-to-go of one finished path.
#pragma once

#include <cstddef>

namespace ppo {

/// For a path of n steps with rewards rew and values val, and last_val the
/// bootstrap value after its last step (0 if the episode terminated):
///   adv[t] = sum_k (gamma lam)^k delta[t+k],  delta[t] = rew[t] + gamma val[t+1] - val[t]
///   ret[t] = sum_k gamma^k rew[t+k] + gamma^(n-t) last_val
/// with val[n] = last_val (Spinning Up's PPOBuffer.finish_path).
inline void gae_lambda(const double* rew, const double* val, std::size_t n, double last_val,
                       double gamma, double lam, double* adv, double* ret) {
    double gae = 0.0, r = last_val, next_v = last_val;
    for (std::size_t i = n; i-- > 0;) {
        gae = rew[i] + gamma * next_v - val[i] + gamma * lam * gae;
        r = rew[i] + gamma * r;
        adv[i] = gae;
        ret[i] = r;
        next_v = val[i];
    }
}

}  // namespace ppo
