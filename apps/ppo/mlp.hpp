// A multilayer perceptron's forward and backward passes on the BLAS (cblas_sgemm),
// over parameters stored elsewhere (mpiml-ppo's LibTorch module), and Adam.
// No LibTorch: for the small MLPs of PPO, LibTorch's per-operator overhead and
// autograd bookkeeping cost more than the arithmetic.
#pragma once

#include <cstddef>
#include <vector>

namespace ppo {

/// One Linear layer, y = x W^T + b, with W [out, in] row-major (LibTorch's
/// layout) and the gradients' storage.
struct LinearRef {
    int in = 0, out = 0;
    const float* w = nullptr;
    const float* b = nullptr;
    float* grad_w = nullptr;
    float* grad_b = nullptr;
};

enum class Activation { tanh, relu };

/// Linear layers with the activation between them and none after the last
/// (Spinning Up's mlp()). Keeps the activations of the last forward for backward.
class Mlp {
public:
    Mlp() = default;
    Mlp(std::vector<LinearRef> layers, Activation act);

    int in_dim() const { return layers_.front().in; }
    int out_dim() const { return layers_.back().out; }

    /// Floating-point operations of forward and backward for n rows (the
    /// matrix products; elementwise work not counted).
    double forward_flops(int n) const;
    double backward_flops(int n) const;

    /// Output [n, out_dim] for x [n, in_dim]; x must stay valid until backward.
    /// The result lives until the next forward.
    const float* forward(const float* x, int n);
    /// From dy = dLoss/dOutput [n, out_dim] of the last forward: writes (does not
    /// add to) every layer's grad_w and grad_b.
    void backward(const float* dy);

private:
    std::vector<LinearRef> layers_;
    Activation act_ = Activation::tanh;
    const float* x_ = nullptr;
    int n_ = 0;
    std::vector<std::vector<float>> h_;  ///< h_[j]: output of layer j
    std::vector<float> dz_, dh_;         ///< scratch for backward
};

/// y[i] = tanh(x[i]) in float, a rational approximation within 2e-7 of tanh
/// (vectorized; std::tanh is scalar).
void tanh_inplace(float* x, std::size_t n);

/// PyTorch's Adam (torch.optim.Adam defaults: betas 0.9, 0.999, eps 1e-8, no
/// weight decay), in place over parameters stored elsewhere.
class Adam {
public:
    struct Param {
        float* value;
        const float* grad;
        std::size_t n;
    };
    Adam(std::vector<Param> params, double lr, double beta1 = 0.9, double beta2 = 0.999,
         double eps = 1e-8);
    void step();

    /// What carries over between steps (for checkpoints): the step count and
    /// both moments of every parameter, in the constructor's order.
    struct State {
        long t = 0;
        std::vector<std::vector<float>> m, v;
    };
    State state() const { return {t_, m_, v_}; }
    /// Throws std::invalid_argument when the shapes differ from this optimizer's.
    void set_state(const State& s);

private:
    std::vector<Param> params_;
    std::vector<std::vector<float>> m_, v_;
    double lr_, beta1_, beta2_, eps_;
    long t_ = 0;
};

}  // namespace ppo
