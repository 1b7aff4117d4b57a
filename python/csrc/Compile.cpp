// torch.compile on phantom: the Python primitives the generated code calls.
//
// Inductor's Python wrapper (python/torch_phantom/_inductor_backend.py)
// emits, for each fused kernel, `cpp_fused_..._0(buf0, arg1_1, ks0)` and,
// for each buffer, `empty_strided_phantom(size, stride, dtype, device)`.
// Both run once per kernel per step of a compiled model: they are the hot
// path of compiled code, so they are plain CPython calls (vectorcall /
// METH_FASTCALL) rather than pybind11 functions, and do no more than read
// their arguments and queue.
//
// A `_CompiledKernel` is what `cpp_fused_..._0` is bound to: calling it
// reads each argument by the kernel's signature (tensors give their device
// address, sizes their value), finds the current stream of the tensors'
// device and queues the kernel there (ops/phantom/ops/CompiledKernel.h).
// It never touches device memory and never waits.
#include "Compile.h"

#include <phantom/Exception.h>
#include <phantom/Stream.h>
#include <phantom/hal.h>
#include <phantom/ops/CompiledKernel.h>

#include <ATen/ops/empty_strided.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <dlfcn.h>

#include <cstring>
#include <string>

namespace py = pybind11;

namespace phantom::python {
namespace {

// How each argument of a kernel is passed, one letter per argument:
// 'p' a tensor's data pointer, 'c' the same for a tensor the kernel only
// reads, 'i' an int64_t, 'f' a float (sent as a double's bits; the
// trampoline narrows it).
constexpr char kPointer = 'p';
constexpr char kConstPointer = 'c';
constexpr char kInteger = 'i';
constexpr char kFloat = 'f';

struct CompiledKernelObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  const CompiledKernel* kernel;
  std::string* kinds;  // one letter per argument (above)
};

PyObject* callCompiledKernel(PyObject* self, PyObject* const* args,
                             size_t nargsf, PyObject* kwnames) {
  HANDLE_TH_ERRORS
  auto* object = reinterpret_cast<CompiledKernelObject*>(self);
  const CompiledKernel& kernel = *object->kernel;
  const std::string& kinds = *object->kinds;
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) > 0) {
    PyErr_Format(PyExc_TypeError,
                 "compiled phantom kernel %s takes positional arguments only",
                 kernel.name.c_str());
    return nullptr;
  }
  if (static_cast<size_t>(nargs) != kinds.size()) {
    PyErr_Format(PyExc_TypeError,
                 "compiled phantom kernel %s takes %zu arguments, got %zd",
                 kernel.name.c_str(), kinds.size(), nargs);
    return nullptr;
  }
  c10::SmallVector<uint64_t, 16> words(kinds.size());
  c10::SmallVector<HostValue, 1> host_values;
  c10::DeviceIndex device = -1;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* arg = args[i];
    switch (kinds[i]) {
      case kPointer:
      case kConstPointer: {
        if (!THPVariable_Check(arg)) {
          PyErr_Format(PyExc_TypeError,
                       "compiled phantom kernel %s: argument %zd must be a "
                       "tensor, got %s",
                       kernel.name.c_str(), i, Py_TYPE(arg)->tp_name);
          return nullptr;
        }
        const at::Tensor& tensor = THPVariable_Unpack(arg);
        const c10::Device where = tensor.device();
        if (where.type() == c10::DeviceType::CPU && kinds[i] == kConstPointer &&
            tensor.numel() == 1 && tensor.element_size() <= 16) {
          // A host scalar the kernel reads (Inductor reads 0-dim CPU
          // tensors inside device kernels): passed by value.
          HostValue value{static_cast<uint16_t>(i), {}};
          std::memcpy(value.bytes, tensor.const_data_ptr(),
                      tensor.element_size());
          host_values.push_back(value);
          words[i] = 0;
          break;
        }
        if (where.type() != c10::DeviceType::PrivateUse1 ||
            (device >= 0 && where.index() != device)) {
          // Inductor gives a kernel the tensors of one device; anything
          // else would make the worker read memory it must not.
          PyErr_Format(PyExc_ValueError,
                       "compiled phantom kernel %s: argument %zd is a tensor "
                       "on %s, but the kernel runs on %s",
                       kernel.name.c_str(), i, where.str().c_str(),
                       device >= 0
                           ? c10::Device(c10::DeviceType::PrivateUse1, device)
                                 .str()
                                 .c_str()
                           : "a phantom device");
          return nullptr;
        }
        device = where.index();
        // An empty tensor may point one past its storage, which is not
        // device memory; the kernel never reads it.
        words[i] = tensor.numel() == 0
                       ? 0
                       : reinterpret_cast<uintptr_t>(tensor.const_data_ptr());
        break;
      }
      case kInteger: {
        const long long value = PyLong_AsLongLong(arg);
        if (value == -1 && PyErr_Occurred()) {
          return nullptr;
        }
        words[i] = static_cast<uint64_t>(value);
        break;
      }
      default: {  // kFloat
        const double value = PyFloat_AsDouble(arg);
        if (value == -1.0 && PyErr_Occurred()) {
          return nullptr;
        }
        std::memcpy(&words[i], &value, sizeof value);
        break;
      }
    }
  }
  if (device < 0) {
    device = getCurrentPhantomStream().device_index();  // only host values
  }
  launchCompiledKernel(kernel, words, getCurrentPhantomStream(device),
                       host_values);
  Py_RETURN_NONE;
  END_HANDLE_TH_ERRORS
}

void deallocCompiledKernel(PyObject* self) {
  delete reinterpret_cast<CompiledKernelObject*>(self)->kinds;
  Py_TYPE(self)->tp_free(self);
}

PyObject* reprCompiledKernel(PyObject* self) {
  const auto* object = reinterpret_cast<CompiledKernelObject*>(self);
  return PyUnicode_FromFormat("<compiled phantom kernel %s(%s)>",
                              object->kernel->name.c_str(),
                              object->kinds->c_str());
}

PyTypeObject compiledKernelType = [] {
  PyTypeObject type{PyVarObject_HEAD_INIT(nullptr, 0)};
  type.tp_name = "torch_phantom._C._CompiledKernel";
  type.tp_basicsize = sizeof(CompiledKernelObject);
  type.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  type.tp_vectorcall_offset = offsetof(CompiledKernelObject, vectorcall);
  type.tp_call = PyVectorcall_Call;
  type.tp_dealloc = deallocCompiledKernel;
  type.tp_repr = reprCompiledKernel;
  type.tp_doc =
      "A kernel generated by torch.compile, queued on the current phantom "
      "stream when called (torch_phantom._inductor_kernels).";
  return type;
}();

// _compiled_kernel(library, symbol, kinds, name): the kernel whose
// trampoline is `symbol` in the shared library `library` (already loaded
// by Inductor's code cache), taking arguments as `kinds` says.
py::object makeCompiledKernel(const std::string& library,
                              const std::string& symbol,
                              const std::string& kinds,
                              const std::string& name) {
  TORCH_CHECK(kinds.find_first_not_of("pcif") == std::string::npos,
              "compiled phantom kernel ", name, ": argument kinds '", kinds,
              "' may only use p (pointer), c (pointer to const), i "
              "(integer) and f (float)");
  TORCH_CHECK(kinds.size() <= UINT16_MAX, "compiled phantom kernel ", name,
              " has too many arguments (", kinds.size(), ")");
  // The handle is kept: the library must stay loaded while any work
  // queued with it may run, i.e. until the process exits.
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle != nullptr, "cannot load compiled phantom kernel ",
              name, " from ", library, ": ", dlerror());
  void* entry = dlsym(handle, symbol.c_str());
  TORCH_CHECK(entry != nullptr, "compiled phantom kernel ", name, ": ",
              library, " has no entry point ", symbol);
  std::vector<uint16_t> pointers;
  for (size_t i = 0; i < kinds.size(); ++i) {
    if (kinds[i] == kPointer || kinds[i] == kConstPointer) {
      pointers.push_back(static_cast<uint16_t>(i));
    }
  }
  const CompiledKernel* kernel = internCompiledKernel(
      reinterpret_cast<CompiledKernelEntry>(entry), name, std::move(pointers),
      kinds.size());
  auto* object = PyObject_New(CompiledKernelObject, &compiledKernelType);
  if (object == nullptr) {
    throw py::error_already_set();
  }
  object->vectorcall = callCompiledKernel;
  object->kernel = kernel;
  object->kinds = new std::string(kinds);
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(object));
}

// empty_strided_phantom(size, stride, dtype, device_index): a new buffer
// from the caching allocator on the current stream of the device, as
// Inductor's empty_strided_cuda does for CUDA (without Python's
// torch.empty_strided argument parsing).
bool readInts(PyObject* sequence, c10::SmallVector<int64_t, 6>& out,
              const char* what) {
  if (!PyTuple_Check(sequence)) {
    PyErr_Format(PyExc_TypeError, "empty_strided_phantom: %s must be a tuple",
                 what);
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(sequence);
  out.resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(sequence, i));
    if (out[i] == -1 && PyErr_Occurred()) {
      return false;
    }
  }
  return true;
}

PyObject* emptyStridedPhantom(PyObject* /*module*/, PyObject* const* args,
                              Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4 || !THPDtype_Check(args[2]) || !PyLong_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError,
                    "empty_strided_phantom(size, stride, dtype, device_index)");
    return nullptr;
  }
  c10::SmallVector<int64_t, 6> sizes;
  c10::SmallVector<int64_t, 6> strides;
  if (!readInts(args[0], sizes, "size") || !readInts(args[1], strides, "stride")) {
    return nullptr;
  }
  const auto dtype = reinterpret_cast<THPDtype*>(args[2])->scalar_type;
  const long device = PyLong_AsLong(args[3]);
  at::Tensor tensor = at::empty_strided(
      sizes, strides,
      at::TensorOptions().dtype(dtype).device(
          c10::Device(c10::DeviceType::PrivateUse1,
                      static_cast<c10::DeviceIndex>(device))));
  return THPVariable_Wrap(std::move(tensor));
  END_HANDLE_TH_ERRORS
}

PyMethodDef compileMethods[] = {
    {"_empty_strided_phantom",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(emptyStridedPhantom)),
     METH_FASTCALL, "empty_strided_phantom(size, stride, dtype, device_index)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

void initCompile(py::module& m) {
  if (PyType_Ready(&compiledKernelType) < 0) {
    throw py::error_already_set();
  }
  Py_INCREF(&compiledKernelType);
  m.add_object("_CompiledKernel",
               py::handle(reinterpret_cast<PyObject*>(&compiledKernelType)));
  if (PyModule_AddFunctions(m.ptr(), compileMethods) < 0) {
    throw py::error_already_set();
  }
  m.def("_compiled_kernel", &makeCompiledKernel);
  // The driver's handle of the current stream of `device`, as an integer:
  // what Inductor's get_raw_stream gives (CUDA's is the cudaStream_t).
  m.def("_raw_stream", [](c10::DeviceIndex device) {
    return reinterpret_cast<intptr_t>(getCurrentPhantomStream(device).handle());
  });
  m.def("_device_properties", [](c10::DeviceIndex device) {
    ph_device_properties_t props{};
    props.struct_size = sizeof props;
    PHANTOM_CHECK(ph_device_get_properties(device, &props));
    py::dict result;
    result["name"] = std::string(props.name);
    result["total_memory"] = props.total_memory;
    result["multi_processor_count"] = props.multiprocessor_count;
    return result;
  });
}

}  // namespace phantom::python
