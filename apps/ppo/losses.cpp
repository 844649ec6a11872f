#include "losses.hpp"

#include <algorithm>
#include <cmath>

namespace ppo {

namespace {

/// log-sum-exp of y[0..m).
float log_sum_exp(const float* y, int m) {
    float mx = y[0];
    for (int k = 1; k < m; ++k) mx = std::max(mx, y[k]);
    float sum = 0;
    for (int k = 0; k < m; ++k) sum += std::exp(y[k] - mx);
    return mx + std::log(sum);
}

thread_local std::vector<float> logp_scratch, dlogp_scratch;

}  // namespace

void log_probs(const float* y, const Batch& b, const PolicyHead& head, float* logp,
               double& ent) {
    const int m = head.out;
    for (int i = 0; i < b.n; ++i) {
        const float* yi = y + static_cast<std::size_t>(i) * m;
        if (head.discrete) {
            const float lse = log_sum_exp(yi, m);
            for (int k = 0; k < m; ++k) ent -= std::exp(yi[k] - lse) * (yi[k] - lse);
            logp[i] = yi[static_cast<int>(b.act[i])] - lse;
        } else {
            float lp = 0;
            for (int d = 0; d < m; ++d) {
                const float z = (b.act[static_cast<std::size_t>(i) * m + d] - yi[d]) *
                                std::exp(-head.log_std[d]);
                lp += -0.5f * z * z - head.log_std[d] - static_cast<float>(half_log_2pi);
            }
            logp[i] = lp;
        }
    }
    if (!head.discrete) {  // the same for every sample: mean over dimensions
        double e = 0;
        for (int d = 0; d < m; ++d) e += 0.5 + half_log_2pi + head.log_std[d];
        ent += e / m * b.n;
    }
}

void log_prob_backward(const float* y, const Batch& b, const PolicyHead& head,
                       const float* dlogp, std::vector<float>& dy) {
    const int m = head.out;
    dy.resize(static_cast<std::size_t>(b.n) * m);
    std::vector<double> g_log_std(head.discrete ? 0 : m, 0.0);
    for (int i = 0; i < b.n; ++i) {
        const float* yi = y + static_cast<std::size_t>(i) * m;
        float* di = dy.data() + static_cast<std::size_t>(i) * m;
        if (head.discrete) {  // d logp / d y_k = [k == a] - softmax_k
            const float lse = log_sum_exp(yi, m);
            const int a = static_cast<int>(b.act[i]);
            for (int k = 0; k < m; ++k)
                di[k] = dlogp[i] * ((k == a ? 1.0f : 0.0f) - std::exp(yi[k] - lse));
        } else {  // d logp / d mu = z / std, d logp / d log_std = z^2 - 1
            for (int d = 0; d < m; ++d) {
                const float inv_std = std::exp(-head.log_std[d]);
                const float z = (b.act[static_cast<std::size_t>(i) * m + d] - yi[d]) * inv_std;
                di[d] = dlogp[i] * z * inv_std;
                g_log_std[d] += static_cast<double>(dlogp[i]) * (z * z - 1.0f);
            }
        }
    }
    for (int d = 0; d < static_cast<int>(g_log_std.size()); ++d)
        head.log_std_grad[d] = static_cast<float>(g_log_std[d]);
}

PiInfo loss_pi(const float* y, const Batch& b, const PolicyHead& head, double clip_ratio,
               std::vector<float>& dy) {
    const int n = b.n;
    logp_scratch.resize(n);
    dlogp_scratch.resize(n);
    PiInfo info;
    log_probs(y, b, head, logp_scratch.data(), info.ent);
    const float lo = static_cast<float>(1 - clip_ratio), hi = static_cast<float>(1 + clip_ratio);
    for (int i = 0; i < n; ++i) {
        const float logp = logp_scratch[i];
        const float ratio = std::exp(logp - b.logp[i]);
        const float adv = b.adv[i];
        const float clip_adv = std::clamp(ratio, lo, hi) * adv;
        info.loss -= std::min(ratio * adv, clip_adv);
        info.kl += b.logp[i] - logp;
        info.cf += ratio > hi || ratio < lo;
        // Autograd's d min(ratio adv, clip_adv) / d ratio: adv inside the clip
        // range (a tie, split between both) or where the unclipped term is smaller.
        const bool flows = (ratio >= lo && ratio <= hi) || ratio * adv < clip_adv;
        dlogp_scratch[i] = flows ? -adv * ratio / static_cast<float>(n) : 0.0f;
    }
    log_prob_backward(y, b, head, dlogp_scratch.data(), dy);
    info.loss /= n, info.kl /= n, info.ent /= n, info.cf /= n;
    return info;
}

PiInfo loss_pi_vpg(const float* y, const Batch& b, const PolicyHead& head,
                   std::vector<float>& dy) {
    const int n = b.n;
    logp_scratch.resize(n);
    dlogp_scratch.resize(n);
    PiInfo info;
    log_probs(y, b, head, logp_scratch.data(), info.ent);
    for (int i = 0; i < n; ++i) {
        info.loss -= static_cast<double>(logp_scratch[i]) * b.adv[i];
        info.kl += b.logp[i] - logp_scratch[i];
        dlogp_scratch[i] = -b.adv[i] / static_cast<float>(n);
    }
    log_prob_backward(y, b, head, dlogp_scratch.data(), dy);
    info.loss /= n, info.kl /= n, info.ent /= n;
    return info;
}

double loss_v(const float* v, const Batch& b, std::vector<float>& dv) {
    dv.resize(static_cast<std::size_t>(b.n));
    double loss = 0;
    for (int i = 0; i < b.n; ++i) {
        const float e = v[i] - b.ret[i];
        loss += static_cast<double>(e) * e;
        dv[i] = 2.0f * e / static_cast<float>(b.n);
    }
    return loss / b.n;
}

}  // namespace ppo
