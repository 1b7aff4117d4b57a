// torch_phantom._settings: the PHANTOM_* settings catalogue and parser
// (device/common, phantom/common/settings.h) for Python.
//
// Design. It is a module of its own, built from the settings library alone
// (no torch, no runtime, no driver), so that `import torch_phantom` can check
// every setting before it loads anything: a malformed value then raises one
// ValueError naming the variable, and torch is left as it was (libphantom,
// once loaded, renames the PrivateUse1 backend and registers kernels, hooks
// and an allocator, which no failed import could take back). Python never
// parses a setting itself; it asks here, and gets the sentence the C++
// readers give.
//
//   catalogue()        every setting: name, kind, default, accepted, meaning,
//                      reader and, for an option list, its options
//   check()            raises SettingError for the first malformed setting
//   value(name)        the setting's value from the environment (the default
//                      when unset); SettingError if malformed
//   parse(name, text)  the value `text` would give
//
// SettingError is a ValueError whose `setting` attribute names the variable.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <phantom/common/settings.h>

#include <string>

namespace {

namespace settings = phantom::settings;

PyObject* setting_error = nullptr;  // the SettingError type

// Sets SettingError(message) with .setting = name; returns nullptr.
PyObject* raiseSettingError(const settings::Spec& spec, const std::string& message) {
  PyObject* error = PyObject_CallFunction(setting_error, "s", message.c_str());
  PyObject* name = PyUnicode_FromString(spec.name);
  if (error != nullptr && name != nullptr &&
      PyObject_SetAttrString(error, "setting", name) == 0) {
    PyErr_SetObject(setting_error, error);
  }
  Py_XDECREF(name);
  Py_XDECREF(error);
  return nullptr;
}

// Adds key -> value to `dict`, taking the reference to `value`.
bool put(PyObject* dict, const char* key, PyObject* value) {
  if (value == nullptr) return false;
  const int status = PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
  return status == 0;
}

PyObject* describe(const settings::Spec& spec) {
  PyObject* dict = PyDict_New();
  PyObject* options = PyList_New(0);
  if (dict == nullptr || options == nullptr) {
    Py_XDECREF(dict);
    Py_XDECREF(options);
    return nullptr;
  }
  for (size_t i = 0; i < spec.option_count; ++i) {
    PyObject* option = describe(*spec.options[i]);
    if (option == nullptr || PyList_Append(options, option) != 0) {
      Py_XDECREF(option);
      Py_DECREF(options);
      Py_DECREF(dict);
      return nullptr;
    }
    Py_DECREF(option);
  }
  const bool ok =
      put(dict, "name", PyUnicode_FromString(spec.name)) &&
      put(dict, "kind", PyUnicode_FromString(settings::KindName(spec.kind))) &&
      put(dict, "default", PyUnicode_FromString(spec.default_text)) &&
      put(dict, "accepted", PyUnicode_FromString(settings::Accepted(spec).c_str())) &&
      put(dict, "meaning", PyUnicode_FromString(spec.meaning)) &&
      put(dict, "reader", PyUnicode_FromString(settings::ReaderName(spec.reader))) &&
      put(dict, "options", options);
  if (!ok) {
    Py_DECREF(dict);
    return nullptr;
  }
  return dict;
}

// The Python value of a parsed setting: int (count, size), bool (switch),
// dict of the options given (option list), str (library, choice).
PyObject* toPython(const settings::Spec& spec, const settings::Value& value) {
  switch (spec.kind) {
    case settings::Kind::kSwitch:
      return PyBool_FromLong(value.number == 1);
    case settings::Kind::kCount:
    case settings::Kind::kSize:
      return PyLong_FromUnsignedLongLong(value.number);
    case settings::Kind::kFraction:
      return PyFloat_FromDouble(value.fraction);
    case settings::Kind::kLibrary:
    case settings::Kind::kChoice:
      return PyUnicode_FromString(value.text.c_str());
    case settings::Kind::kOptions: {
      PyObject* dict = PyDict_New();
      if (dict == nullptr) return nullptr;
      for (const settings::Value::Option& option : value.options) {
        PyObject* item = option.spec->kind == settings::Kind::kFraction
                             ? PyFloat_FromDouble(option.fraction)
                             : PyLong_FromUnsignedLongLong(option.number);
        if (!put(dict, option.spec->name, item)) {
          Py_DECREF(dict);
          return nullptr;
        }
      }
      return dict;
    }
  }
  Py_RETURN_NONE;
}

const settings::Spec* findOrRaise(const char* name) {
  const settings::Spec* spec = settings::Find(name);
  if (spec == nullptr) {
    PyErr_Format(PyExc_KeyError, "%s is not a phantom setting", name);
  }
  return spec;
}

PyObject* catalogue(PyObject*, PyObject*) {
  PyObject* list = PyList_New(0);
  if (list == nullptr) return nullptr;
  for (const settings::Spec* spec : settings::kAll) {
    PyObject* entry = describe(*spec);
    if (entry == nullptr || PyList_Append(list, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return list;
}

PyObject* check(PyObject*, PyObject*) {
  for (const settings::Spec* spec : settings::kAll) {
    settings::Value value;
    std::string error;
    if (!settings::ReadEnvironment(*spec, &value, &error)) {
      return raiseSettingError(*spec, error);
    }
  }
  Py_RETURN_NONE;
}

PyObject* value(PyObject*, PyObject* args) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  const settings::Spec* spec = findOrRaise(name);
  if (spec == nullptr) return nullptr;
  settings::Value parsed;
  std::string error;
  if (!settings::ReadEnvironment(*spec, &parsed, &error)) {
    return raiseSettingError(*spec, error);
  }
  return toPython(*spec, parsed);
}

PyObject* parse(PyObject*, PyObject* args) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (!PyArg_ParseTuple(args, "sz", &name, &text)) return nullptr;
  const settings::Spec* spec = findOrRaise(name);
  if (spec == nullptr) return nullptr;
  settings::Value parsed;
  std::string error;
  if (!settings::Parse(*spec, text, &parsed, &error)) {
    return raiseSettingError(*spec, error);
  }
  return toPython(*spec, parsed);
}

PyMethodDef methods[] = {
    {"catalogue", catalogue, METH_NOARGS,
     "Every PHANTOM_* setting: a list of dicts with name, kind, default, "
     "accepted, meaning, reader and options."},
    {"check", check, METH_NOARGS,
     "Raises SettingError (a ValueError) for the first malformed PHANTOM_* "
     "setting in the environment."},
    {"value", value, METH_VARARGS,
     "value(name): the setting's value from the environment, or its default "
     "when unset; SettingError if malformed."},
    {"parse", parse, METH_VARARGS,
     "parse(name, text): the value `text` (None: unset) gives the setting; "
     "SettingError if malformed."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_settings",
                          "Phantom's PHANTOM_* settings, parsed by the C++ "
                          "settings library.",
                          -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__settings() {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  setting_error = PyErr_NewExceptionWithDoc(
      "torch_phantom._settings.SettingError",
      "A PHANTOM_* environment variable has a malformed value; `setting` "
      "names it.",
      PyExc_ValueError, nullptr);
  // The module holds a reference of its own; ours lives as long as the
  // process (the module is never unloaded).
  if (setting_error == nullptr ||
      PyModule_AddObjectRef(module, "SettingError", setting_error) != 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
