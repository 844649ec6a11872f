#include "mlp.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

// The elementwise loops get an AVX2+FMA clone beside the baseline one.
#define PPO_SIMD __attribute__((target_clones("avx512f", "arch=haswell", "default")))

namespace ppo {

PPO_SIMD void tanh_inplace(float* x, std::size_t n) {
    // Eigen's float tanh: an odd 13/6 rational fit on [-9, 9].
    for (std::size_t i = 0; i < n; ++i) {
        const float v = std::min(std::max(x[i], -9.0f), 9.0f);
        const float v2 = v * v;
        float p = -2.76076847742355e-16f;
        p = p * v2 + 2.00018790482477e-13f;
        p = p * v2 - 8.60467152213735e-11f;
        p = p * v2 + 5.12229709037114e-08f;
        p = p * v2 + 1.48572235717979e-05f;
        p = p * v2 + 6.37261928875436e-04f;
        p = p * v2 + 4.89352455891786e-03f;
        float q = 1.19825839466702e-06f;
        q = q * v2 + 1.18534705686654e-04f;
        q = q * v2 + 2.26843463243900e-03f;
        q = q * v2 + 4.89352518554385e-03f;
        x[i] = v * p / q;
    }
}

namespace {

/// y[r, :] = act(y[r, :] + b) for r < n.
PPO_SIMD void bias_act(float* y, const float* b, int n, int m, bool hidden, Activation act) {
    for (int r = 0; r < n; ++r) {
        float* row = y + static_cast<std::size_t>(r) * m;
        for (int c = 0; c < m; ++c) row[c] += b[c];
        if (hidden && act == Activation::relu)
            for (int c = 0; c < m; ++c) row[c] = std::max(row[c], 0.0f);
    }
    if (hidden && act == Activation::tanh) tanh_inplace(y, static_cast<std::size_t>(n) * m);
}

/// dz = dh * act'(h) for n rows of m, with h the activation's output, and
/// gb = the column sums of dz (the bias gradient), in one pass.
PPO_SIMD void act_backward(const float* dh, const float* h, float* dz, int n, int m,
                           Activation act, float* gb) {
    std::fill(gb, gb + m, 0.0f);
    for (int r = 0; r < n; ++r) {
        const std::size_t o = static_cast<std::size_t>(r) * m;
        if (act == Activation::tanh)
            for (int c = 0; c < m; ++c) dz[o + c] = dh[o + c] * (1.0f - h[o + c] * h[o + c]);
        else
            for (int c = 0; c < m; ++c) dz[o + c] = h[o + c] > 0.0f ? dh[o + c] : 0.0f;
        for (int c = 0; c < m; ++c) gb[c] += dz[o + c];
    }
}

/// gb[c] = sum over rows of dz[:, c].
PPO_SIMD void column_sums(const float* dz, int n, int m, float* gb) {
    std::fill(gb, gb + m, 0.0f);
    for (int r = 0; r < n; ++r) {
        const float* row = dz + static_cast<std::size_t>(r) * m;
        for (int c = 0; c < m; ++c) gb[c] += row[c];
    }
}

}  // namespace

Mlp::Mlp(std::vector<LinearRef> layers, Activation act) : layers_(std::move(layers)), act_(act) {
    if (layers_.empty()) throw std::invalid_argument("Mlp: no layers");
    for (std::size_t j = 1; j < layers_.size(); ++j)
        if (layers_[j].in != layers_[j - 1].out)
            throw std::invalid_argument("Mlp: layer sizes do not chain");
    h_.resize(layers_.size());
}

double Mlp::forward_flops(int n) const {
    double f = 0;
    for (const auto& l : layers_) f += 2.0 * n * l.in * l.out;
    return f;
}

double Mlp::backward_flops(int n) const {
    // grad_w of every layer, and dh of every layer but the first.
    return 2.0 * forward_flops(n) - 2.0 * n * layers_.front().in * layers_.front().out;
}

const float* Mlp::forward(const float* x, int n) {
    x_ = x;
    n_ = n;
    const float* in = x;
    for (std::size_t j = 0; j < layers_.size(); ++j) {
        const LinearRef& l = layers_[j];
        auto& y = h_[j];
        const std::size_t size = static_cast<std::size_t>(n) * l.out;
        if (y.size() < size) y.resize(size);
        if (n == 1) {  // a matrix-vector product: no BLAS call overhead
            for (int o = 0; o < l.out; ++o) {
                const float* w = l.w + static_cast<std::size_t>(o) * l.in;
                float s = 0.0f;
                for (int i = 0; i < l.in; ++i) s += w[i] * in[i];
                y[o] = s;
            }
        } else {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, l.out, l.in, 1.0f, in, l.in,
                        l.w, l.in, 0.0f, y.data(), l.out);
        }
        bias_act(y.data(), l.b, n, l.out, j + 1 < layers_.size(), act_);
        in = y.data();
    }
    return in;
}

void Mlp::backward(const float* dy) {
    const int n = n_;
    int widest = 0;
    for (const auto& l : layers_) widest = std::max({widest, l.in, l.out});
    const std::size_t cap = static_cast<std::size_t>(n) * widest;
    if (dz_.size() < cap) dz_.resize(cap), dh_.resize(cap);

    const float* dz = dy;  // dLoss/d(pre-activation output) of layer j
    column_sums(dy, n, layers_.back().out, layers_.back().grad_b);
    for (std::size_t j = layers_.size(); j-- > 0;) {
        const LinearRef& l = layers_[j];
        const float* in = j == 0 ? x_ : h_[j - 1].data();
        // grad_w [out, in] = dz^T [out, n] * in [n, in]
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, l.out, l.in, n, 1.0f, dz, l.out, in,
                    l.in, 0.0f, l.grad_w, l.in);
        if (j == 0) break;
        // dh [n, in] = dz [n, out] * W [out, in], then through the activation
        // (with the bias gradient of layer j - 1).
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, l.in, l.out, 1.0f, dz, l.out,
                    l.w, l.in, 0.0f, dh_.data(), l.in);
        act_backward(dh_.data(), in, dz_.data(), n, l.in, act_, layers_[j - 1].grad_b);
        dz = dz_.data();
    }
}

Adam::Adam(std::vector<Param> params, double lr, double beta1, double beta2, double eps)
    : params_(std::move(params)), lr_(lr), beta1_(beta1), beta2_(beta2), eps_(eps) {
    for (const auto& p : params_) {
        m_.emplace_back(p.n, 0.0f);
        v_.emplace_back(p.n, 0.0f);
    }
}

void Adam::set_state(const State& s) {
    if (s.m.size() != params_.size() || s.v.size() != params_.size())
        throw std::invalid_argument("Adam::set_state: " + std::to_string(s.m.size()) +
                                    " parameters, this optimizer has " +
                                    std::to_string(params_.size()));
    for (std::size_t k = 0; k < params_.size(); ++k)
        if (s.m[k].size() != params_[k].n || s.v[k].size() != params_[k].n)
            throw std::invalid_argument("Adam::set_state: parameter " + std::to_string(k) +
                                        " has another size");
    t_ = s.t;
    m_ = s.m;
    v_ = s.v;
}

namespace {
PPO_SIMD void adam_kernel(float* p, const float* g, float* m, float* v, std::size_t n, float b1,
                          float b2, float bc2_sqrt, float eps, float step_size) {
    for (std::size_t i = 0; i < n; ++i) {
        m[i] = m[i] * b1 + (1.0f - b1) * g[i];
        v[i] = v[i] * b2 + (1.0f - b2) * g[i] * g[i];
        const float denom = std::sqrt(v[i]) / bc2_sqrt + eps;
        p[i] = p[i] - step_size * (m[i] / denom);
    }
}
}  // namespace

void Adam::step() {
    ++t_;
    // LibTorch's order of operations, scalars in double as it computes them.
    const double bc1 = 1.0 - std::pow(beta1_, static_cast<double>(t_));
    const double bc2 = 1.0 - std::pow(beta2_, static_cast<double>(t_));
    const double step_size = lr_ / bc1;
    for (std::size_t k = 0; k < params_.size(); ++k)
        adam_kernel(params_[k].value, params_[k].grad, m_[k].data(), v_[k].data(), params_[k].n,
                    static_cast<float>(beta1_), static_cast<float>(beta2_),
                    static_cast<float>(std::sqrt(bc2)), static_cast<float>(eps_),
                    static_cast<float>(step_size));
}

}  // namespace ppo
