// Fused LSTM and GRU cells. On devices other than the CPU, ATen's LSTM and
// GRU layers call _thnn_fused_lstm_cell / _thnn_fused_gru_cell and their
// backwards, which exist only as CUDA kernels, so the generic path has
// nothing to run. Here they are computed with CPU ops over the device
// memory, as work on the current stream.
//
// The workspace each forward saves for its backward is ours to define:
//   LSTM: [i, f, g, o] gate activations, shape (batch, 4 * hidden)
//   GRU:  [r, z, n, hx, hn] with hn the hidden part of the new-gate input,
//         shape (batch, 5 * hidden)
// The backward formulas are the derivatives of the forward below.
//
// Without a kernel view (a driver whose memory the host cannot address)
// the same formulas run on the calling thread over host copies of the
// inputs, and the results are copied to the device, as the copying CPU
// fallback runs other ops there.
//
// They take the gates the CPU's cells compute with (float, double, half,
// bfloat16, complex): integer gates are refused at the call with the
// NotImplementedError of CUDA's kernels, where the formulas would compute
// float results from them.
#include <phantom/Launch.h>
#include <phantom/Stream.h>
#include <phantom/SyncDebug.h>
#include <phantom/KernelAliases.h>
#include <phantom/ops/GenericPath.h>

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

namespace phantom {
namespace {

using OptionalTensor = std::optional<at::Tensor>;

bool present(const OptionalTensor& t) {
  return t.has_value() && t->defined();
}

// The inputs as host copies, for a driver without a kernel view: `alias`
// has KernelAliases' signature, so a cell's body takes either.
struct HostCopiesOfInputs {
  at::Tensor alias(const at::Tensor& t) const { return t.to(at::kCPU); }
};

// Runs `body` on the current stream of `device` with CPU aliases (or, with
// no kernel view, on this thread with host copies) and moves the CPU
// results it returns to the device.
template <size_t N, typename Body>
std::array<at::Tensor, N> runCell(const char* name, c10::Device device,
                                  Body&& body) {
  const c10::DeviceGuard guard(device);
  std::array<at::Tensor, N> results;
  noteHostWait(name,
               "phantom computes the fused RNN cells on the host and waits "
               "for them; a device kernel would be queued");
  if (!kernelViewAvailable()) {
    HostCopiesOfInputs inputs;
    const std::array<at::Tensor, N> cpu = body(inputs);
    for (size_t i = 0; i < N; ++i) {
      if (cpu[i].defined()) results[i] = cpu[i].to(device);
    }
    return results;
  }
  launchAndWait(getCurrentPhantomStream(device.index()), name, [&] {
    KernelAliases aliases;
    const std::array<at::Tensor, N> cpu = body(aliases);
    for (size_t i = 0; i < N; ++i) {
      results[i] = newDeviceTensorFrom(cpu[i], device);
    }
  });
  return results;
}

void checkGatesDtype(const char* op, const at::Tensor& gates) {
  const c10::ScalarType dtype = gates.scalar_type();
  TORCH_CHECK_NOT_IMPLEMENTED(
      dtype == at::kFloat || dtype == at::kDouble || dtype == at::kHalf ||
          dtype == at::kBFloat16 || dtype == at::kComplexFloat ||
          dtype == at::kComplexDouble,
      "\"", op, "\" not implemented for '", c10::toString(dtype), "'");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmCell(
    const at::Tensor& input_gates, const at::Tensor& hidden_gates,
    const at::Tensor& cx, const OptionalTensor& input_bias,
    const OptionalTensor& hidden_bias) {
  checkGatesDtype("_thnn_fused_lstm_cell", input_gates);
  auto [hy, cy, workspace] = runCell<3>(
      "aten::_thnn_fused_lstm_cell", input_gates.device(),
      [&](auto& a) -> std::array<at::Tensor, 3> {
        at::Tensor gates = a.alias(input_gates) + a.alias(hidden_gates);
        if (present(input_bias)) {
          gates = gates + a.alias(*input_bias);
        }
        if (present(hidden_bias)) {
          gates = gates + a.alias(*hidden_bias);
        }
        auto chunks = gates.chunk(4, 1);
        at::Tensor i = chunks[0].sigmoid();
        at::Tensor f = chunks[1].sigmoid();
        at::Tensor g = chunks[2].tanh();
        at::Tensor o = chunks[3].sigmoid();
        at::Tensor c = f * a.alias(cx) + i * g;
        at::Tensor h = o * c.tanh();
        return {h, c, at::cat({i, f, g, o}, 1)};
      });
  return {hy, cy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmCellBackward(
    const OptionalTensor& grad_hy, const OptionalTensor& grad_cy,
    const at::Tensor& cx, const at::Tensor& cy, const at::Tensor& workspace,
    bool has_bias) {
  checkGatesDtype("_thnn_fused_lstm_cell_backward_impl", workspace);
  auto [grad_gates, grad_cx, grad_bias] = runCell<3>(
      "aten::_thnn_fused_lstm_cell_backward_impl", cx.device(),
      [&](auto& a) -> std::array<at::Tensor, 3> {
        auto gates = a.alias(workspace).chunk(4, 1);
        const at::Tensor &i = gates[0], &f = gates[1], &g = gates[2],
                         &o = gates[3];
        const at::Tensor tanh_cy = a.alias(cy).tanh();
        at::Tensor d_c = present(grad_cy) ? a.alias(*grad_cy).clone()
                                          : at::zeros_like(tanh_cy);
        at::Tensor d_o = at::zeros_like(tanh_cy);
        if (present(grad_hy)) {
          const at::Tensor gh = a.alias(*grad_hy);
          d_c = d_c + gh * o * (1 - tanh_cy * tanh_cy);
          d_o = gh * tanh_cy;
        }
        const at::Tensor d_gates = at::cat(
            {d_c * g * i * (1 - i), d_c * a.alias(cx) * f * (1 - f),
             d_c * i * (1 - g * g), d_o * o * (1 - o)},
            1);
        return {d_gates, d_c * f,
                has_bias ? d_gates.sum(0) : at::Tensor()};
      });
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<at::Tensor, at::Tensor> gruCell(const at::Tensor& input_gates,
                                           const at::Tensor& hidden_gates,
                                           const at::Tensor& hx,
                                           const OptionalTensor& input_bias,
                                           const OptionalTensor& hidden_bias) {
  checkGatesDtype("_thnn_fused_gru_cell", input_gates);
  auto [hy, workspace] = runCell<2>(
      "aten::_thnn_fused_gru_cell", input_gates.device(),
      [&](auto& a) -> std::array<at::Tensor, 2> {
        at::Tensor in = a.alias(input_gates);
        at::Tensor hidden = a.alias(hidden_gates);
        if (present(input_bias)) {
          in = in + a.alias(*input_bias);
        }
        if (present(hidden_bias)) {
          hidden = hidden + a.alias(*hidden_bias);
        }
        auto ic = in.chunk(3, 1);
        auto hc = hidden.chunk(3, 1);
        at::Tensor r = (ic[0] + hc[0]).sigmoid();
        at::Tensor z = (ic[1] + hc[1]).sigmoid();
        at::Tensor n = (ic[2] + r * hc[2]).tanh();
        const at::Tensor h = a.alias(hx);
        at::Tensor out = (1 - z) * n + z * h;
        return {out, at::cat({r, z, n, h, hc[2]}, 1)};
      });
  return {hy, workspace};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
gruCellBackward(const at::Tensor& grad_hy, const at::Tensor& workspace,
                bool has_bias) {
  checkGatesDtype("_thnn_fused_gru_cell_backward", workspace);
  auto results = runCell<5>(
      "aten::_thnn_fused_gru_cell_backward", grad_hy.device(),
      [&](auto& a) -> std::array<at::Tensor, 5> {
        auto w = a.alias(workspace).chunk(5, 1);
        const at::Tensor &r = w[0], &z = w[1], &n = w[2], &h = w[3],
                         &hn = w[4];
        const at::Tensor gh = a.alias(grad_hy);
        const at::Tensor d_n = gh * (1 - z) * (1 - n * n);
        const at::Tensor d_z = gh * (h - n) * z * (1 - z);
        const at::Tensor d_r = d_n * hn * r * (1 - r);
        const at::Tensor d_input = at::cat({d_r, d_z, d_n}, 1);
        const at::Tensor d_hidden = at::cat({d_r, d_z, d_n * r}, 1);
        return {d_input, d_hidden, gh * z,
                has_bias ? d_input.sum(0) : at::Tensor(),
                has_bias ? d_hidden.sum(0) : at::Tensor()};
      });
  return {results[0], results[1], results[2], results[3], results[4]};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(lstmCell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(lstmCellBackward));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(gruCell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(gruCellBackward));
}

}  // namespace phantom
