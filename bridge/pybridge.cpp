// libattncheck_pybridge.so: the attncheck kernel plugin ABI (kernels_under_test/attncheck_abi.h)
// implemented by an embedded CPython calling an adapter module (docs/bridge.md).
//
// On first use it initializes the interpreter (or attaches to one that is already running),
// imports attncheck_bridge (bridge/python) and the adapter named by $ATTNCHECK_PY_ADAPTER (a module
// name or a path to a .py file). Memory is host memory for "cpu" adapters (aligned malloc/memcpy,
// no Python involved) and torch CUDA allocations for "cuda" adapters (through
// attncheck_bridge._host, so nothing here links CUDA). run() hands the adapter one
// DLPack-exportable view per argument; attncheck_bridge._host classifies what the adapter raises
// into statuses.
//
// Nothing throws across the ABI and nothing prints to stdout: an interpreter this library starts
// has sys.stdout pointed at stderr (in a worker both go to the worker log; the protocol channel
// is private to the worker, run/pool.h). A copy of the process that an adapter forked and that
// returns from an entry exits at once: the harness must not evaluate one case twice.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "attncheck_abi.h"

#ifndef ATTNCHECK_BRIDGE_PYTHON_DIR
#define ATTNCHECK_BRIDGE_PYTHON_DIR ""
#endif
#ifndef ATTNCHECK_BRIDGE_ADAPTERS_DIR
#define ATTNCHECK_BRIDGE_ADAPTERS_DIR ""
#endif
#ifndef ATTNCHECK_PYTHON_EXECUTABLE
#define ATTNCHECK_PYTHON_EXECUTABLE ""
#endif

#define AC_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

constexpr size_t kHostAlign = 256;

void put(char* dst, size_t n, const std::string& s) {
  if (dst && n) std::snprintf(dst, n, "%s", s.c_str());
}

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool is_file(const std::string& p) {
  return !p.empty() && ::access(p.c_str(), R_OK) == 0;
}

// Holds the GIL for a scope, from any thread.
class Gil {
 public:
  Gil() : state_(PyGILState_Ensure()) {}
  ~Gil() { PyGILState_Release(state_); }
  Gil(const Gil&) = delete;
  Gil& operator=(const Gil&) = delete;

 private:
  PyGILState_STATE state_;
};

// An owned reference.
class Ref {
 public:
  explicit Ref(PyObject* p = nullptr) : p_(p) {}
  ~Ref() { Py_XDECREF(p_); }
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  PyObject* get() const { return p_; }
  explicit operator bool() const { return p_ != nullptr; }
  PyObject* release() {
    PyObject* p = p_;
    p_ = nullptr;
    return p;
  }

 private:
  PyObject* p_;
};

std::string utf8(PyObject* o) {
  if (!o) return "";
  Ref s(PyObject_Str(o));
  if (!s) {
    PyErr_Clear();
    return "?";
  }
  const char* c = PyUnicode_AsUTF8(s.get());
  if (!c) {
    PyErr_Clear();
    return "?";
  }
  return c;
}

// The pending Python exception as text (type, message, traceback's last lines), cleared. Never
// PyErr_Print: it would exit the process on SystemExit.
std::string take_error() {
  PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
  PyErr_Fetch(&type, &value, &tb);
  if (!type) return "unknown Python error";
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  std::string text;
  Ref mod(PyImport_ImportModule("traceback"));
  if (mod) {
    Ref lines(PyObject_CallMethod(mod.get(), "format_exception", "OOO", type,
                                  value ? value : Py_None, tb ? tb : Py_None));
    if (lines) {
      Ref joined(PyUnicode_Join(Ref(PyUnicode_FromString("")).get(), lines.get()));
      if (joined) text = utf8(joined.get());
    }
  }
  if (PyErr_Occurred()) PyErr_Clear();
  if (text.empty()) {
    text = reinterpret_cast<PyTypeObject*>(type)->tp_name;
    if (value) text += ": " + utf8(value);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  // Keep the tail: the exception line and the innermost frames.
  size_t pos = text.size();
  for (int lines = 0; lines < 8 && pos != std::string::npos && pos > 0; ++lines)
    pos = text.rfind('\n', pos - 1);
  return pos == std::string::npos || pos == 0 ? text : text.substr(pos + 1);
}

// ---------------------------------------------------------------------------------------------
// _attncheck_native: DLPack capsules over the harness's buffers.

struct Managed {
  DLManagedTensor dl{};
  std::vector<int64_t> shape, strides;
};

void managed_deleter(DLManagedTensor* self) {
  // The data belongs to the harness; only the descriptor is ours.
  delete static_cast<Managed*>(self->manager_ctx);
}

void capsule_destructor(PyObject* capsule) {
  // A consumer renames the capsule to "used_dltensor" and owns the tensor from then on.
  if (!PyCapsule_IsValid(capsule, "dltensor")) return;
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
  if (m && m->deleter) m->deleter(m);
}

bool int64_list(PyObject* seq, const char* what, std::vector<int64_t>* out) {
  Ref fast(PySequence_Fast(seq, what));
  if (!fast) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast.get());
  out->resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast.get(), i));
    if (v == -1 && PyErr_Occurred()) return false;
    (*out)[static_cast<size_t>(i)] = v;
  }
  return true;
}

// dlpack_capsule(data, byte_offset, device_type, device_id, code, bits, lanes, shape, strides)
PyObject* dlpack_capsule(PyObject*, PyObject* args) {
  unsigned long long data = 0, byte_offset = 0;
  int device_type = 0, device_id = 0, code = 0, bits = 0, lanes = 0;
  PyObject *shape = nullptr, *strides = nullptr;
  if (!PyArg_ParseTuple(args, "KKiiiiiOO", &data, &byte_offset, &device_type, &device_id, &code,
                        &bits, &lanes, &shape, &strides))
    return nullptr;
  auto* m = new Managed();
  if (!int64_list(shape, "shape must be a sequence", &m->shape) ||
      !int64_list(strides, "strides must be a sequence", &m->strides)) {
    delete m;
    return nullptr;
  }
  if (m->shape.size() != m->strides.size()) {
    delete m;
    PyErr_SetString(PyExc_ValueError, "shape and strides differ in length");
    return nullptr;
  }
  DLTensor& t = m->dl.dl_tensor;
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(data));
  t.device = {static_cast<DLDeviceType>(device_type), static_cast<int32_t>(device_id)};
  t.ndim = static_cast<int32_t>(m->shape.size());
  t.dtype = {static_cast<uint8_t>(code), static_cast<uint8_t>(bits), static_cast<uint16_t>(lanes)};
  t.shape = m->shape.data();
  t.strides = m->strides.data();
  t.byte_offset = byte_offset;
  m->dl.manager_ctx = m;
  m->dl.deleter = managed_deleter;
  PyObject* capsule = PyCapsule_New(&m->dl, "dltensor", capsule_destructor);
  if (!capsule) delete m;
  return capsule;
}

PyMethodDef kNativeMethods[] = {
    {"dlpack_capsule", dlpack_capsule, METH_VARARGS,
     "dlpack_capsule(data, byte_offset, device_type, device_id, code, bits, lanes, shape, "
     "strides) -> 'dltensor' capsule viewing memory it does not own"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef kNativeModule = {PyModuleDef_HEAD_INIT,
                             "_attncheck_native",
                             "Native half of attncheck_bridge (libattncheck_pybridge.so).",
                             -1,
                             kNativeMethods,
                             nullptr,
                             nullptr,
                             nullptr,
                             nullptr};

// ---------------------------------------------------------------------------------------------
// The adapter, loaded once per process.

struct State {
  bool loaded = false;
  std::string spec;             // $ATTNCHECK_PY_ADAPTER
  std::string error;            // why the adapter is unusable ("" when loaded)
  PyObject* host = nullptr;     // attncheck_bridge._host
  PyObject* adapter = nullptr;  // the adapter's ADAPTER
  bool cuda = false;
  std::string library = "attncheck-pybridge";
  std::string ops;
  std::map<std::string, std::string> contracts;   // entry -> declared arithmetic contract
  std::map<std::string, std::string> properties;  // entry -> declared invariance properties
  std::map<std::string, std::string> partials;    // entry -> declared partial contract (JSON)
  pid_t pid = 0;                                  // the process that loaded the adapter
};

std::mutex g_mutex;
State g;

std::string who() {
  return "py adapter '" + g.spec + "'";
}

std::string library_dir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&library_dir), &info) || !info.dli_fname) return "";
  std::string p = info.dli_fname;
  const auto slash = p.rfind('/');
  return slash == std::string::npos ? "." : p.substr(0, slash);
}

// Starts the interpreter unless one is running; false with *err on failure.
bool start_python(bool* started, std::string* err) {
  *started = false;
  if (Py_IsInitialized()) return true;
  // Extension modules (numpy, torch) resolve the C API from the global scope, but the harness
  // dlopens this library RTLD_LOCAL: promote libpython to RTLD_GLOBAL first.
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&Py_IsInitialized), &info) && info.dli_fname)
    dlopen(info.dli_fname, RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD);

  PyConfig config;
  PyConfig_InitPythonConfig(&config);  // honours PYTHONPATH, PYTHONHOME, ...
  config.install_signal_handlers = 0;  // SIGINT and friends stay the harness's
  config.parse_argv = 0;
  // The interpreter CMake found: its sys.prefix, and its venv (pyvenv.cfg) when it is one.
  std::string exe = env("ATTNCHECK_PY_EXECUTABLE");
  if (exe.empty()) exe = ATTNCHECK_PYTHON_EXECUTABLE;
  PyStatus st = PyStatus_Ok();
  if (is_file(exe)) st = PyConfig_SetBytesString(&config, &config.program_name, exe.c_str());
  if (!PyStatus_Exception(st)) st = Py_InitializeFromConfig(&config);
  PyConfig_Clear(&config);
  if (PyStatus_Exception(st)) {
    *err = "cannot start the embedded Python (" + (exe.empty() ? std::string("?") : exe) +
           "): " + (st.err_msg ? st.err_msg : "?");
    return false;
  }
  *started = true;
  PyEval_SaveThread();  // from here on every entry takes the GIL with PyGILState_Ensure
  return true;
}

int run_code(const char* code) {
  PyObject* main = PyImport_AddModule("__main__");  // borrowed
  if (!main) return -1;
  PyObject* globals = PyModule_GetDict(main);  // borrowed
  Ref r(PyRun_String(code, Py_file_input, globals, globals));
  return r ? 0 : -1;
}

// [(entry, text)] from the _host function `method` into `into`; false (g.error set) when the
// answer is not such a list.
bool read_entry_texts(PyObject* host, PyObject* adapter, const char* method, const char* what,
                      std::map<std::string, std::string>& into) {
  Ref answer(PyObject_CallMethod(host, method, "O", adapter));
  Ref items(answer ? PySequence_Fast(answer.get(), "not a sequence") : nullptr);
  if (!items) {
    g.error = who() + ": cannot read the entries' " + what + ": " + take_error();
    return false;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(items.get()); ++i) {
    const char *entry = nullptr, *text = nullptr;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(items.get(), i), "ss", &entry, &text)) {
      g.error = who() + ": cannot read the entries' " + what + ": " + take_error();
      return false;
    }
    into[entry] = text;
  }
  return true;
}

// Under the GIL: sys setup, attncheck_bridge, the adapter. Sets g.error on failure.
void load_adapter(bool started) {
  if (started) {
    // stdout is the worker's protocol channel: Python's prints go to stderr. faulthandler puts
    // the Python stack of a crashing adapter on stderr before the signal takes the process down.
    if (run_code("import sys, faulthandler\n"
                 "sys.stdout = sys.stderr\n"
                 "if not getattr(sys, 'argv', None): sys.argv = ['attncheck-pybridge']\n"
                 "faulthandler.enable(file=sys.stderr)\n") != 0) {
      g.error = "setting up the embedded Python failed: " + take_error();
      return;
    }
  }
  PyObject* modules = PyImport_GetModuleDict();  // borrowed
  if (!PyDict_GetItemString(modules, "_attncheck_native")) {
    Ref native(PyModule_Create(&kNativeModule));
    if (!native || PyDict_SetItemString(modules, "_attncheck_native", native.get()) != 0) {
      g.error = "cannot create module _attncheck_native: " + take_error();
      return;
    }
  }
  // attncheck_bridge: $ATTNCHECK_PYBRIDGE_PYTHON, else python/ beside this library (an installed
  // layout), else the source tree this library was built from. The bundled adapters go last.
  std::string dir = env("ATTNCHECK_PYBRIDGE_PYTHON");
  if (dir.empty()) {
    const std::string beside = library_dir() + "/python";
    dir = is_file(beside + "/attncheck_bridge/__init__.py") ? beside : ATTNCHECK_BRIDGE_PYTHON_DIR;
  }
  PyObject* path = PySys_GetObject("path");  // borrowed
  if (!path || !PyList_Check(path)) {
    g.error = "the embedded Python has no sys.path list";
    return;
  }
  {
    Ref d(PyUnicode_DecodeFSDefault(dir.c_str()));
    if (!d || PyList_Insert(path, 0, d.get()) != 0) {
      g.error = "cannot extend sys.path: " + take_error();
      return;
    }
    const std::string adapters = ATTNCHECK_BRIDGE_ADAPTERS_DIR;
    if (!adapters.empty()) {
      Ref a(PyUnicode_DecodeFSDefault(adapters.c_str()));
      if (!a || PyList_Append(path, a.get()) != 0) PyErr_Clear();
    }
  }
  Ref host(PyImport_ImportModule("attncheck_bridge._host"));
  if (!host) {
    g.error = who() + ": cannot import attncheck_bridge (from " + dir +
              "; set ATTNCHECK_PYBRIDGE_PYTHON to the directory holding it): " + take_error();
    return;
  }
  Ref adapter(PyObject_CallMethod(host.get(), "load_adapter", "s", g.spec.c_str()));
  if (!adapter) {
    // BridgeError's message is complete (it names the adapter); anything else gets the prefix.
    PyObject *type = nullptr, *value = nullptr, *tb = nullptr;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Ref bridge_error(PyObject_GetAttrString(host.get(), "BridgeError"));
    if (bridge_error && value && PyObject_IsInstance(value, bridge_error.get()) == 1) {
      g.error = utf8(value);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(tb);
    } else {
      PyErr_Restore(type, value, tb);
      g.error = who() + ": loading failed: " + take_error();
    }
    if (PyErr_Occurred()) PyErr_Clear();
    return;
  }
  Ref desc(PyObject_CallMethod(host.get(), "describe", "O", adapter.get()));
  const char *library = nullptr, *device = nullptr, *ops = nullptr;
  if (!desc || !PyArg_ParseTuple(desc.get(), "sss", &library, &device, &ops)) {
    g.error = who() + ": cannot describe the adapter: " + take_error();
    return;
  }
  g.library = library;
  g.cuda = std::strcmp(device, "cuda") == 0;
  g.ops = ops;
  // Each entry's declared contract, invariance properties and partial contract (their form
  // validated by attncheck_bridge when the entry registered; the names the harness checks).
  if (!read_entry_texts(host.get(), adapter.get(), "entry_contracts", "contracts", g.contracts) ||
      !read_entry_texts(host.get(), adapter.get(), "entry_properties", "properties",
                        g.properties) ||
      !read_entry_texts(host.get(), adapter.get(), "entry_partials", "partial contracts",
                        g.partials))
    return;
  g.host = host.release();
  g.adapter = adapter.release();
}

// Loads the adapter once; false (with msg) when it is unusable.
bool ready(char* msg = nullptr, size_t msg_len = 0) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g.loaded) {
    g.loaded = true;
    g.pid = ::getpid();
    g.spec = env("ATTNCHECK_PY_ADAPTER");
    bool started = false;
    std::string err;
    if (g.spec.empty()) {
      g.error =
          "py adapter: ATTNCHECK_PY_ADAPTER is not set (a module name or a path to a .py file; "
          "attncheck sets it for --kernels py:<module>)";
    } else if (!start_python(&started, &err)) {
      g.error = who() + ": " + err;
    } else {
      Gil gil;
      try {
        load_adapter(started);
      } catch (const std::exception& e) {
        g.error = who() + ": " + e.what();
      }
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (!g.error.empty())
      g.library = "attncheck-pybridge (" + (g.spec.empty() ? std::string("no adapter") : who()) +
                  " failed to load)";
  }
  if (!g.error.empty()) {
    put(msg, msg_len, g.error);
    return false;
  }
  return true;
}

// An entry that called os.fork() returns twice; the child's return ends here, before the harness
// evaluates (and answers for) the case a second time.
void exit_if_forked_copy() {
  if (::getpid() != g.pid) ::_exit(0);
}

// (status, message) tuple -> status, message to msg. Other shapes are bridge failures.
int status_of(PyObject* result, char* msg, size_t msg_len, const char* what, double* a = nullptr,
              double* b = nullptr) {
  if (!result) {
    put(msg, msg_len, who() + ": bridge failure in " + what + ": " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  int status = ATTNCHECK_HOST_ERROR;
  const char* text = "";
  double x = 0, y = 0;
  const bool ok = a ? (b ? PyArg_ParseTuple(result, "isdd", &status, &text, &x, &y)
                         : PyArg_ParseTuple(result, "isd", &status, &text, &x))
                    : PyArg_ParseTuple(result, "is", &status, &text);
  if (!ok) {
    put(msg, msg_len, who() + ": bridge failure in " + what + ": " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  put(msg, msg_len, text);
  if (a) *a = x;
  if (b) *b = y;
  return status;
}

// The arguments as a list of (name, data, byte_offset, shape, strides, code, bits, lanes).
PyObject* arg_list(const attncheck_arg* args, int n_args) {
  Ref list(PyList_New(0));
  if (!list) return nullptr;
  for (int i = 0; i < n_args; ++i) {
    const DLTensor& t = args[i].tensor;
    const int nd = t.ndim > 0 ? t.ndim : 0;
    Ref shape(PyTuple_New(nd)), strides(PyTuple_New(nd));
    if (!shape || !strides) return nullptr;
    int64_t contiguous = 1;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t stride = t.strides ? t.strides[d] : contiguous;
      contiguous *= t.shape[d];
      PyTuple_SET_ITEM(shape.get(), d, PyLong_FromLongLong(t.shape[d]));
      PyTuple_SET_ITEM(strides.get(), d, PyLong_FromLongLong(stride));
    }
    Ref item(Py_BuildValue("(sKKOOiii)", args[i].name ? args[i].name : "",
                           static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(t.data)),
                           static_cast<unsigned long long>(t.byte_offset), shape.get(),
                           strides.get(), static_cast<int>(t.dtype.code),
                           static_cast<int>(t.dtype.bits), static_cast<int>(t.dtype.lanes)));
    if (!item || PyList_Append(list.get(), item.get()) != 0) return nullptr;
  }
  return list.release();
}

// ---------------------------------------------------------------------------------------------
// The table.

const char* ops() {
  if (!ready()) return "";
  return g.ops.c_str();
}

int device_info(char* name, size_t name_len, char* arch, size_t arch_len, char* msg,
                size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_ERROR;
  if (!g.cuda) {
    put(name, name_len, "host (py adapter " + g.spec + ")");
    put(arch, arch_len, "cpu");
    return ATTNCHECK_OK;
  }
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "query_device", "Os", g.adapter, g.spec.c_str()));
  const char *n = nullptr, *a = nullptr, *m = nullptr;
  int status = ATTNCHECK_ERROR;
  if (!r || !PyArg_ParseTuple(r.get(), "isss", &status, &m, &n, &a)) {
    put(msg, msg_len, who() + ": device query failed: " + take_error());
    return ATTNCHECK_NO_DEVICE;
  }
  put(msg, msg_len, m);
  put(name, name_len, n);
  put(arch, arch_len, a);
  return status;
}

int alloc(size_t bytes, void** ptr, char* msg, size_t msg_len) {
  if (!ptr) return ATTNCHECK_ERROR;
  *ptr = nullptr;
  if (!ready(msg, msg_len)) return ATTNCHECK_ERROR;
  if (!g.cuda) {
    const size_t n = (bytes ? bytes : 1) + kHostAlign - 1;
    if (::posix_memalign(ptr, kHostAlign, n - n % kHostAlign) != 0) {
      *ptr = nullptr;
      put(msg, msg_len, who() + ": host allocation of " + std::to_string(bytes) + " bytes failed");
      return ATTNCHECK_ERROR;
    }
    return ATTNCHECK_OK;
  }
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "cuda_alloc", "K", static_cast<unsigned long long>(bytes)));
  int status = ATTNCHECK_ERROR;
  const char* m = "";
  unsigned long long p = 0;
  if (!r || !PyArg_ParseTuple(r.get(), "isK", &status, &m, &p)) {
    put(msg, msg_len, who() + ": torch allocation failed: " + take_error());
    return ATTNCHECK_ERROR;
  }
  put(msg, msg_len, m);
  if (status == ATTNCHECK_OK) *ptr = reinterpret_cast<void*>(static_cast<uintptr_t>(p));
  return status;
}

int release(void* ptr) {
  if (!ptr) return ATTNCHECK_OK;
  if (!ready()) return ATTNCHECK_ERROR;
  if (!g.cuda) {
    std::free(ptr);
    return ATTNCHECK_OK;
  }
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "cuda_release", "K",
                            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr))));
  if (!r) {
    PyErr_Clear();
    return ATTNCHECK_ERROR;
  }
  return PyObject_IsTrue(r.get()) == 1 ? ATTNCHECK_OK : ATTNCHECK_ERROR;
}

int copy(bool to_device, void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_ERROR;
  if (bytes == 0) return ATTNCHECK_OK;
  if (!g.cuda) {
    std::memcpy(dst, src, bytes);
    return ATTNCHECK_OK;
  }
  Gil gil;
  // The host side as a buffer torch.frombuffer can wrap (writable, so it does not warn; the
  // copy to the device only reads it).
  void* host = to_device ? const_cast<void*>(src) : dst;
  const void* device = to_device ? dst : src;
  Ref view(PyMemoryView_FromMemory(static_cast<char*>(host), static_cast<Py_ssize_t>(bytes),
                                   PyBUF_WRITE));
  if (!view) {
    put(msg, msg_len, who() + ": " + take_error());
    return ATTNCHECK_ERROR;
  }
  Ref r(PyObject_CallMethod(g.host, to_device ? "cuda_copy_to_device" : "cuda_copy_to_host", "KO",
                            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(device)),
                            view.get()));
  const int status = status_of(r.get(), msg, msg_len, "copy");
  return status == ATTNCHECK_HOST_ERROR ? ATTNCHECK_ERROR : status;
}

int copy_to_device(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  return copy(true, dst, src, bytes, msg, msg_len);
}

int copy_to_host(void* dst, const void* src, size_t bytes, char* msg, size_t msg_len) {
  return copy(false, dst, src, bytes, msg, msg_len);
}

int run(const char* op, const char* params_json, const attncheck_arg* args, int n_args, char* msg,
        size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_HOST_ERROR;
  Gil gil;
  Ref list(arg_list(args, n_args));
  if (!list) {
    put(msg, msg_len, who() + ": cannot marshal the arguments: " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  Ref r(PyObject_CallMethod(g.host, "run", "OssOs", g.adapter, g.spec.c_str(), op ? op : "",
                            list.get(), params_json ? params_json : "{}"));
  exit_if_forked_copy();
  return status_of(r.get(), msg, msg_len, "run");
}

int time(const char* op, const char* params_json, const attncheck_arg* args, int n_args, int warmup,
         int iters, double* ms, char* msg, size_t msg_len) {
  if (ms) *ms = -1;
  if (!ready(msg, msg_len)) return ATTNCHECK_HOST_ERROR;
  Gil gil;
  Ref list(arg_list(args, n_args));
  if (!list) {
    put(msg, msg_len, who() + ": cannot marshal the arguments: " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  Ref r(PyObject_CallMethod(g.host, "time", "OssOsii", g.adapter, g.spec.c_str(), op ? op : "",
                            list.get(), params_json ? params_json : "{}", warmup, iters));
  exit_if_forked_copy();
  double mean = -1;
  const int status = status_of(r.get(), msg, msg_len, "time", &mean);
  if (ms) *ms = mean;
  return status;
}

int roofline(double* copy_gbps, double* matrix_tflops, char* msg, size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_ERROR;
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "roofline", "Os", g.adapter, g.spec.c_str()));
  double gbps = 0, tflops = 0;
  const int status = status_of(r.get(), msg, msg_len, "roofline", &gbps, &tflops);
  if (copy_gbps) *copy_gbps = gbps;
  if (matrix_tflops) *matrix_tflops = tflops;
  return status == ATTNCHECK_HOST_ERROR ? ATTNCHECK_ERROR : status;
}

// The extension's `contract`: the entry's declared contract, NULL for an entry the adapter lacks.
const char* contract(const char* op) {
  if (!op || !ready()) return nullptr;
  const auto it = g.contracts.find(op);
  return it == g.contracts.end() ? nullptr : it->second.c_str();
}

// The extension's `properties`: the entry's declared invariance properties, NULL for none.
const char* properties(const char* op) {
  if (!op || !ready()) return nullptr;
  const auto it = g.properties.find(op);
  return it == g.properties.end() ? nullptr : it->second.c_str();
}

// The extension's `partial`: the entry's declared partial contract as JSON, NULL for none.
const char* partial(const char* op) {
  if (!op || !ready()) return nullptr;
  const auto it = g.partials.find(op);
  return it == g.partials.end() ? nullptr : it->second.c_str();
}

// The extension's `case_context`: the case whose launches follow, handed to attncheck_bridge
// (its `invalid()` and `current_case()`), so that adapters ask the op instead of re-coding it.
int case_context(const char* case_json, char* msg, size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_HOST_ERROR;
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "set_case", "s", case_json ? case_json : "null"));
  if (!r) {
    put(msg, msg_len, who() + ": set_case failed: " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  return ATTNCHECK_OK;
}

// The extension's graph capture (docs/bridge.md "Graph replay"): the entry, if it declared itself
// graph-capturable, captured into a torch.cuda.CUDAGraph that the Python side keeps under a
// handle (never 0); the handle travels as the opaque pointer.
int graph_capture(const char* op, const char* params_json, const attncheck_arg* args, int n_args,
                  void** graph, char* msg, size_t msg_len) {
  if (graph) *graph = nullptr;
  if (!graph || !ready(msg, msg_len)) return ATTNCHECK_HOST_ERROR;
  Gil gil;
  Ref list(arg_list(args, n_args));
  if (!list) {
    put(msg, msg_len, who() + ": cannot marshal the arguments: " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  Ref r(PyObject_CallMethod(g.host, "graph_capture", "OssOs", g.adapter, g.spec.c_str(),
                            op ? op : "", list.get(), params_json ? params_json : "{}"));
  exit_if_forked_copy();
  int status = ATTNCHECK_HOST_ERROR;
  const char* text = "";
  unsigned long long handle = 0;
  if (!r || !PyArg_ParseTuple(r.get(), "isK", &status, &text, &handle)) {
    put(msg, msg_len, who() + ": bridge failure in graph_capture: " + take_error());
    return ATTNCHECK_HOST_ERROR;
  }
  put(msg, msg_len, text);
  if (status == ATTNCHECK_OK) *graph = reinterpret_cast<void*>(static_cast<uintptr_t>(handle));
  return status;
}

int graph_replay(void* graph, char* msg, size_t msg_len) {
  if (!ready(msg, msg_len)) return ATTNCHECK_HOST_ERROR;
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "graph_replay", "sK", g.spec.c_str(),
                            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(graph))));
  return status_of(r.get(), msg, msg_len, "graph_replay");
}

void graph_release(void* graph) {
  if (!graph || !ready()) return;
  Gil gil;
  Ref r(PyObject_CallMethod(g.host, "graph_release", "K",
                            static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(graph))));
  if (!r) PyErr_Clear();
}

attncheck_plugin_v1 g_table = {
    ATTNCHECK_ABI_VERSION, "attncheck-pybridge", ops, device_info, alloc,   release,
    copy_to_device,        copy_to_host,         run, time,        roofline};

// No fill, background work, copies within the device or page-locked host memory: the harness
// uploads poison, runs without concurrent kernels, copies each storage on its own and stages in
// ordinary memory.
const attncheck_plugin_ext_v1 g_extension = {sizeof(attncheck_plugin_ext_v1), nullptr, nullptr,
                                             contract, case_context, properties, graph_capture,
                                             graph_replay, graph_release, nullptr,
                                             // One thread: adapters keep per-call state in Python
                                             // (torch's current stream is per thread).
                                             0, nullptr, nullptr, partial};

}  // namespace

// The plugin entry point. Loads the adapter (so `library` names it) and returns the table.
AC_EXPORT const attncheck_plugin_v1* attncheck_plugin_v1_get(void) {
  ready();
  g_table.library = g.library.c_str();
  return &g_table;
}

// The optional extension table (kernels_under_test/attncheck_abi.h): the entries' contracts, the
// case context, the entries' invariance properties and partial contracts, graph capture.
AC_EXPORT const attncheck_plugin_ext_v1* attncheck_plugin_ext_v1_get(void) {
  return &g_extension;
}

// The same library imported as a Python extension module (tests, or an adapter process that wants
// DLPack capsules without the harness): importlib's ExtensionFileLoader("_attncheck_native", path).
AC_EXPORT PyObject* PyInit__attncheck_native(void) {
  return PyModule_Create(&kNativeModule);
}
