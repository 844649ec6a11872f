// Spinning Up's PPO and VPG losses with their gradients, on plain arrays
// (the update's kernels; no LibTorch).
#pragma once

#include <vector>

namespace ppo {

constexpr double half_log_2pi = 0.91893853320467274178;  // 0.5 log(2 pi)

/// One epoch's data on this rank, as the update reads it.
struct Batch {
    int n = 0;
    std::vector<float> obs;   ///< [n, obs_dim]
    std::vector<float> act;   ///< [n] action indices (discrete) or [n, act_dim]
    std::vector<float> ret;   ///< rewards-to-go
    std::vector<float> adv;   ///< normalized advantages
    std::vector<float> logp;  ///< log-probabilities when the actions were taken
};

/// The policy's output layer: logits of a categorical (discrete), or the
/// means of a Gaussian with a state-independent log_std [out].
struct PolicyHead {
    bool discrete = true;
    int out = 0;
    const float* log_std = nullptr;
    float* log_std_grad = nullptr;  ///< written by the losses (Gaussian)
};

struct PiInfo {
    double loss = 0, kl = 0, ent = 0, cf = 0;
};

/// Log-probabilities of b's actions under the policy's output y [n, out]
/// into logp [n]; adds each sample's entropy to ent.
void log_probs(const float* y, const Batch& b, const PolicyHead& head, float* logp,
               double& ent);

/// From dLoss/dlogp [n]: dLoss/dy [n, out] into dy, and the log_std gradient.
void log_prob_backward(const float* y, const Batch& b, const PolicyHead& head,
                       const float* dlogp, std::vector<float>& dy);

/// PPO-clip: loss = -mean(min(ratio adv, clip(ratio, 1-eps, 1+eps) adv)),
/// ratio = exp(logp - logp_old), with kl = mean(logp_old - logp), the mean
/// entropy and the clipped fraction; dLoss/dy into dy as autograd computes it.
PiInfo loss_pi(const float* y, const Batch& b, const PolicyHead& head, double clip_ratio,
               std::vector<float>& dy);

/// VPG: loss = -mean(logp adv), with kl and entropy as loss_pi (cf = 0).
PiInfo loss_pi_vpg(const float* y, const Batch& b, const PolicyHead& head,
                   std::vector<float>& dy);

/// mean((v - ret)^2) for the value net's output v [n]; dLoss/dv into dv.
double loss_v(const float* v, const Batch& b, std::vector<float>& dv);

}  // namespace ppo
